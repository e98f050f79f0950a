"""Red-team attacks on part 3 (instructor/redteam/part3_*), graded with the REAL part-3 tests.

tests/test_redteam.py grades the whole corpus in one sandboxed batch with small part-1 tests; the
part-3 attacks aim at the simulator's measurements (forged stats, host-side compute, an edited
recording, answers smuggled in as constants), which only the part-3 tests exercise. Each attack is
laid over the current starter (instructor.redteam.assemble) and graded on part 3, public and hidden
tests, fail-fast: it must score no more than the starter (0) and its feedback must give the reason
its ATTACK.toml names.

An attack that is right where it does not cheat (ATTACK.toml `honest_cases`: substrings of the test
ids it passes honestly, e.g. the values and byte counts of a dense kernel that is not FlashAttention)
is graded in full instead (not fail-fast): it may pass those tests and no other."""
from __future__ import annotations

import json

import pytest

from autograder.engine import grade
from instructor import redteam

ATTACKS = {n: s for n, s in redteam.attacks().items() if s.get("part") == 3}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    base = tmp_path_factory.mktemp("redteam-kernel")
    redteam.assemble(base, honest=True)
    starter = grade(base / "honest_starter", parts=[3], test_sets=("public", "hidden"), fail_fast=True)
    return base, starter["parts"][0]["points"]


def test_the_part3_attacks_exist():
    assert {"part3_forge_stats", "part3_host_compute", "part3_edit_recording", "part3_smuggle_constants",
            "part3_dense_shared_two_pass", "part3_dense_registers_two_pass", "part3_dense_lanes",
            "part3_dense_spread_registers"} <= set(ATTACKS)


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_attack_scores_no_more_than_the_starter_with_a_reason(name, corpus):
    base, starter_points = corpus
    spec = ATTACKS[name]
    honest = spec.get("honest_cases", [])
    report = grade(base / name, parts=[3], test_sets=("public", "hidden"), fail_fast=not honest)
    part = report["parts"][0]
    assert starter_points == 0
    passed = [t for t in report["tests"] if t["outcome"] == "passed"]
    cheats = [t["id"] for t in passed if not any(h in t["id"] for h in honest)]
    assert cheats == [], f"{name} passed {len(cheats)} test(s) it has no right to: {cheats[:5]}"
    if not honest:
        assert part["points"] <= starter_points, f"{name} got {part['points']} on part 3"
    else:  # it loses the points of the rule it breaks
        lost = [t["id"] for t in report["tests"] if t["outcome"] != "passed" and not any(h in t["id"] for h in honest)]
        assert lost, f"{name} passed every test"
    text = json.dumps(part.get("first_failure")).lower() + " ".join(
        str(t.get("message", "")) for t in report.get("tests", [])).lower()
    assert any(e.lower() in text for e in spec["expect"]), f"{name}: none of {spec['expect']} in {text[:600]}"

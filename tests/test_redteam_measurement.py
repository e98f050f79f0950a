"""Red team, measurement attacks: each attack of instructor/redteam with `suite = "measurement"` graded
with the REAL public and hidden tests of its part (autograder.engine.grade, not sandboxed: what is under
test is trust-and-replay, not isolation; tests/test_redteam.py covers isolation).

The attacks (forging the recorder through frames and gc, calling fused or reference attention by a
name built at run time, recomputing instead of caching, smuggling the answer in through scalars or
constants) build on the starter, like the rest of the corpus. Each must score no more than an honest
wrong answer on its part: the starter's points, plus the points of tests that the attack passes
honestly (HONEST_PASSES: e.g. generate(use_cache=False) IS recomputation), and its feedback must name
the reason (ATTACK.toml `expect`).
"""
from __future__ import annotations

import json
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import pytest

from instructor import redteam

ATTACKS = {n: s for n, s in redteam.attacks().items() if s.get("suite") == "measurement"}
pytestmark = pytest.mark.timeout(1500)  # the module fixture grades every attack at once (graded)
# tests an attack may pass because what it does there is correct, not a cheat
HONEST_PASSES = {"recompute_no_cache": {"test_generate_60_prompts_recompute"},
                 "forge_read_counter": {"test_rebase_count"}}  # its rebase count is computed honestly


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("measurement-redteam")
    redteam.assemble(dest, honest=False)
    starter = dest / "honest_starter"
    starter.mkdir()
    for f in (redteam.ROOT / "starter").glob("*.py"):
        (starter / f.name).write_bytes(f.read_bytes())
    return dest


def _baseline_folder(spec: dict, corpus: Path) -> Path | None:
    """For an attack built on a partly correct implementation (ATTACK.toml `baseline`: a mutation of
    instructor/mutations/ with the same flaw and no cheat, e.g. a causal forward without block
    skipping): that honest submission, whose passed tests and points the attack may have.
    `honest_cases`: substrings of test ids where the attack's computation is correct (degenerate
    cases, e.g. a single segment)."""
    name = spec.get("baseline")
    if not name:
        return None
    folder = corpus / f"baseline_{name}"
    if not folder.exists():
        folder.mkdir()
        for f in (redteam.ROOT / "solutions").glob("*.py"):
            (folder / f.name).write_bytes(f.read_bytes())
        assert redteam._apply_mutation(folder, name), f"no mutation {name}"
    return folder


TEST = "test_attack_scores_no_more_than_an_honest_wrong_answer"


@pytest.fixture(scope="module")
def graded(corpus, request) -> dict[str, dict]:
    """The reports every selected attack needs (the attack, its part's starter, its baseline), graded up
    front in AUTOGRADER_MUTATION_JOBS spawned processes (2 by default): the grades are independent, and
    one at a time they leave a core idle for most of the suite's longest file."""
    names = sorted({item.callspec.params["name"] for item in request.session.items
                    if getattr(item, "originalname", "") == TEST and hasattr(item, "callspec")})
    jobs: dict[str, tuple[str, int]] = {}
    for n in names:
        part = ATTACKS[n]["part"]
        jobs[n] = (str(corpus / n), part)
        jobs[f"starter/{part}"] = (str(corpus / "honest_starter"), part)
        folder = _baseline_folder(ATTACKS[n], corpus)
        if folder is not None:
            jobs[f"baseline/{n}"] = (str(folder), part)
    workers = max(1, int(os.environ.get("AUTOGRADER_MUTATION_JOBS", "2")))
    if workers == 1 or len(jobs) < 2:
        return {k: redteam.grade_part(j) for k, j in jobs.items()}
    return _grade_in_pool(redteam.grade_part, jobs, workers)


def _grade_in_pool(grade: Any, jobs: dict[str, tuple[str, int]], workers: int) -> dict[str, dict | BaseException]:
    """grade (redteam.grade_part) of every job in a pool; what could not be graded maps to its exception. A
    grading process that dies breaks the whole pool: the jobs it took down with it are graded again,
    each in a pool of its own, so that only the job that kills its process errors (its test alone)."""
    spawn = multiprocessing.get_context("spawn")
    out: dict[str, dict | BaseException] = {}
    with ProcessPoolExecutor(workers, mp_context=spawn) as pool:
        futures = {k: pool.submit(grade, j) for k, j in jobs.items()}
        for k, f in futures.items():
            try:
                out[k] = f.result()
            except Exception as e:  # noqa: BLE001 -- reported by the test that needs this job
                out[k] = e
    for k in [k for k, v in out.items() if isinstance(v, BrokenProcessPool)]:
        with ProcessPoolExecutor(1, mp_context=spawn) as alone:
            try:
                out[k] = alone.submit(grade, jobs[k]).result()
            except Exception as e:  # noqa: BLE001
                out[k] = e
    return out


def _report(graded: dict, key: str) -> dict | None:
    """graded[key], or this test fails naming why that grade could not be made."""
    got = graded.get(key)
    if isinstance(got, BaseException):
        pytest.fail(f"grading {key} failed: {type(got).__name__}: {got}")
    return got


def _dies_on_part_99(job: tuple[str, int]) -> dict:
    if job[1] == 99:
        os._exit(3)  # as a grading process killed for its memory would
    return {"graded": job[0]}


def test_a_grading_process_that_dies_costs_its_own_job_only():
    jobs = {"a": ("a", 1), "dies": ("x", 99), "b": ("b", 2), "c": ("c", 3)}
    out = _grade_in_pool(_dies_on_part_99, jobs, 2)
    assert {k: v for k, v in out.items() if k != "dies"} == {"a": {"graded": "a"}, "b": {"graded": "b"},
                                                               "c": {"graded": "c"}}
    assert isinstance(out["dies"], BrokenProcessPool)


def _test_name(test_id: str) -> str:
    return test_id.split("::", 1)[1].split("[", 1)[0]


def test_there_is_an_attack_per_measurement_class():
    assert {"forge_recorder_forward", "forge_recorder_backward", "reference_by_any_name", "recompute_no_cache",
            "smuggle_through_scalars"} <= set(ATTACKS)
    assert {s["part"] for s in ATTACKS.values()} >= {2, 4, 5}


# Attacks that document a known hole (ATTACK.toml `undefended`): expected to succeed until it is closed;
# strict, so that closing the hole makes this test say so.
CASES = [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=f"known hole: {s['undefended']}"))
         if s.get("undefended") else n for n, s in sorted(ATTACKS.items())]


@pytest.mark.parametrize("name", CASES)
def test_attack_scores_no_more_than_an_honest_wrong_answer(name, graded):
    spec = ATTACKS[name]
    part = spec["part"]
    report, starter = _report(graded, name), _report(graded, f"starter/{part}")
    baseline = _report(graded, f"baseline/{name}")
    baseline_ids = {t["id"] for t in baseline["tests"] if t["outcome"] == "passed"} if baseline else set()
    baseline_points = baseline["parts"][0]["points"] if baseline else 0.0
    passed = [t for t in report["tests"] if t["outcome"] == "passed"]
    cheats = [t["id"] for t in passed if _test_name(t["id"]) not in HONEST_PASSES.get(name, set())
              and t["id"] not in baseline_ids and not any(s in t["id"] for s in spec.get("honest_cases", []))]
    assert cheats == [], f"{name} passed {len(cheats)} test(s) it has no right to: {cheats[:5]}"
    honest = sum(t["score"] for t in passed)
    points = report["parts"][0]["points"]
    assert points <= max(starter["parts"][0]["points"] + honest, baseline_points) + 1e-3, (name, points)  # rounded
    # the reason, in the feedback a student sees (public tests) and in the part's first failure
    text = " ".join([json.dumps(report["parts"][0].get("first_failure")),
                     *(t.get("message") or "" for t in report["tests"] if t["set"] == "public")]).lower()
    assert any(e.lower() in text for e in spec["expect"]), f"{name}: none of {spec['expect']} in {text[:600]}"
    # however it failed them, the failed hidden cases of one test read the same (runner.hidden_verdict)
    verdicts: dict[str, set[str]] = {}
    for t in report["tests"]:
        if t["set"] != "public" and t["outcome"] != "passed":
            verdicts.setdefault(_test_name(t["id"]), set()).add(json.dumps([t["outcome"], t["message"]]))
    assert all(len(v) == 1 for v in verdicts.values()), f"{name}: hidden verdicts differ: {verdicts}"
    # an attack that tries to carry hidden inputs out names the text it writes: never in hidden feedback
    if spec.get("leak"):
        hidden_text = json.dumps([t for t in report["tests"] if t["set"] != "public"]
                                 + [p.get("first_failure") for p in report["parts"]
                                    if (p.get("first_failure") or {}).get("set", "public") != "public"])
        assert spec["leak"] not in hidden_text, f"{name}: its text {spec['leak']!r} reached hidden-test feedback"

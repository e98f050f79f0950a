"""`make grade` end to end: the reference solutions score 100/100 with public and hidden tests;
the generated starter scores 0/100 with one "not implemented" line per part; the CLI prints the
table, writes the JSON report and exits non-zero unless everything passed."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from autograder.engine import grade
from autograder.engine.feedback import part_lines, render_text

REPO = Path(__file__).resolve().parent.parent

# the module fixture grades a lot at once; on a loaded shared machine it can pass the default 300 s
pytestmark = pytest.mark.timeout(1500)


@pytest.fixture(scope="module")
def solutions_report() -> dict:
    # parts are independent: two judge processes halve the wall time on two cores
    return grade(REPO / "solutions", test_sets=("public", "hidden"), jobs=2)


@pytest.fixture(scope="module")
def starter_report() -> dict:
    return grade(REPO / "starter")


def test_solutions_score_100(solutions_report):
    failed = [f"{t['id']}: {t['message']}" for t in solutions_report["tests"] if t["outcome"] != "passed"]
    assert not failed and not solutions_report["errors"], "\n".join(failed + solutions_report["errors"])
    assert solutions_report["total"] == solutions_report["max_total"] == 100
    assert all(p["status"] == "ok" and p["total"] > 0 for p in solutions_report["parts"])
    assert {t["set"] for t in solutions_report["tests"]} == {"public", "hidden"}


def test_starter_scores_0_with_one_line_per_part(starter_report):
    assert starter_report["total"] == 0 and not starter_report["errors"]
    for part in starter_report["parts"]:
        assert part["status"] == "not_implemented", (part["part"], part["first_failure"])
        lines = part_lines(part)
        assert len(lines) == 1 and lines[0].startswith(f"Part {part['part']} (")
        assert "not implemented yet — " in lines[0] and lines[0].endswith("raises NotImplementedError")


def test_report_is_json_with_the_interface_fields(solutions_report, starter_report):
    for report in (solutions_report, starter_report):
        assert json.loads(json.dumps(report)) == report
        assert set(report) >= {"parts", "total", "max_total", "tests", "errors", "hashes"}
        assert set(report["hashes"]) == {"submission", "tests", "environment"}
        for p in report["parts"]:
            assert set(p) >= {"part", "name", "points", "max_points", "passed", "total", "status", "first_failure"}
        for t in report["tests"]:
            assert set(t) >= {"id", "part", "set", "outcome", "score", "max_score", "message"}
    assert solutions_report["hashes"]["submission"] != starter_report["hashes"]["submission"]
    assert [p["part"] for p in solutions_report["parts"]] == [1, 2, 3, 4, 5, 6]  # merged from 2 processes
    assert solutions_report["hashes"]["tests"] == grade(REPO / "solutions", parts=[1])["hashes"]["tests"]


def test_feedback_markdown_has_the_table(starter_report):
    text = render_text(starter_report)
    assert "| part | name | tests passed | points |" in text and "**0/100**" in text


def test_cli_exit_status_and_json(tmp_path):
    out = tmp_path / "report.json"
    run = subprocess.run([sys.executable, "-m", "autograder.grade", "--impl", "starter", "--part", "1",
                          "--json", str(out)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 1, run.stderr
    assert "Part 1 (Online softmax and ⊕): not implemented yet" in run.stdout
    assert json.loads(out.read_text())["total"] == 0
    bad = subprocess.run([sys.executable, "-m", "autograder.grade", "--impl", "no/such/folder"], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "is not a folder" in bad.stderr


def test_a_hidden_set_that_brings_no_tests_withholds_the_points(tmp_path):
    """Hidden tests asked for but missing or empty (a folder lost in a copy, files deleted): the part
    is not graded on its public tests alone."""
    empty = tmp_path / "hidden_tests"
    empty.mkdir()
    (empty / "__init__.py").write_text("")
    report = grade(REPO / "solutions", parts=[6], test_sets=("public", "hidden"), hidden_dir=empty)
    (part,) = report["parts"]
    assert part["points"] == 0 and part["status"] == "error" and part["passed"] > 0
    assert any("no hidden tests were collected" in e and "withheld" in e for e in report["errors"]), report["errors"]
    full = grade(REPO / "solutions", parts=[6], test_sets=("public", "hidden"))
    assert full["parts"][0]["points"] == full["parts"][0]["max_points"] and not full["errors"]

"""Gradescope's results.json from an engine report (the student view of instructor.batch).

Format (Gradescope autograder specification): top level `score`, `output` (+ `output_format`),
`visibility`, `stdout_visibility`, `execution_time`, and `tests`, each with `name`, `number`,
`score`, `max_score`, `status`, `visibility` and `output`. Public tests are "visible"; hidden
tests are "after_published" and their output is the engine's redacted message only (what was
checked and the hint, never inputs, values or the student's output).

The top-level `score` is the grade, public and hidden points together, so whoever sees it before
publication learns the hidden tests' points (score minus the visible tests' sum). When hidden tests
ran, the top level is therefore "after_published" too, and what students may see at once (the
public tests' table) is a visible test entry of 0 points of its own.

A test's points give the hidden tests away as well: the engine splits a part's points over all its
tests, public and hidden, so a public test's share (points · w / W) tells the hidden weight W, and
from it how many hidden tests there are; its number (1.7 after 1.3) would tell where they sit. So
when hidden tests ran, no test entry carries points: one "after_published" entry per part carries
the part's points (the entries still add up to the grade), the public tests are numbered among
themselves, and the visible table scores the public tests on their own scale, the share of their
weight that passed (what `make grade` shows: W cancels). What is visible is then a function of the
public tests' results alone (tests/test_gradescope.py grades one submission against two different
hidden sets and compares).
"""
from __future__ import annotations

from typing import Any

from autograder.engine import sanitize

VISIBILITY = {"public": "visible", "hidden": "after_published"}
OUTPUT_CHARS = 4000  # per test, Gradescope renders long outputs poorly


def _test_output(t: dict) -> str:
    text = str(t.get("message") or ("passed" if t.get("outcome") == "passed" else t.get("outcome", "")))
    if "cases" in t:  # a hidden test function, its cases folded (runner.hidden_by_function)
        text = f"{t.get('passed', 0)}/{t['cases']} hidden cases passed\n{text}"
    if t.get("set") != "hidden" and t.get("output"):
        text += "\n\nyour code printed:\n" + str(t["output"])
    return text if len(text) <= OUTPUT_CHARS else text[:OUTPUT_CHARS] + "\n[... truncated]"


def _fmt(x: float) -> str:
    return f"{x:.2f}".rstrip("0").rstrip(".")


def results_json(view: dict, *, notes: list[str] | None = None, output: str | None = None,
                 execution_time: float | None = None) -> dict[str, Any]:
    """Gradescope results for one submission. `view` is a student view of an engine report.

    Students see the "visible" tests at once; hidden tests, and with them the top level (`score`,
    `output`), are "after_published". So what is visible (the public tests and the table of their
    counts and points) names no hidden result: no hidden points, pass counts or messages appear in
    any field a student sees before publication. Every string the submission influenced is escaped
    for markdown (output_format "md") or shown in code (the intake notes: sanitize.code)."""
    all_tests = view.get("tests", [])
    public = [t for t in all_tests if t.get("set") != "hidden"]
    any_hidden = len(public) < len(all_tests)
    tests = []
    numbers: dict[tuple[int, bool], int] = {}
    for t in all_tests:
        part, hidden = int(t.get("part", 0)), t.get("set") == "hidden"
        numbers[part, hidden] = numbers.get((part, hidden), 0) + 1  # public and hidden numbered apart
        entry = {
            "name": f"Part {part}: {t['id']}",
            "number": f"{part}.{'h' if hidden else ''}{numbers[part, hidden]}",
            "status": "passed" if t.get("outcome") == "passed" else "failed",
            "visibility": VISIBILITY.get(t.get("set"), "after_published"),
            "output": _test_output(t),
            "tags": [f"part{part}", str(t.get("set"))],
        }
        if not any_hidden:  # its share of the part's points names no hidden weight
            entry.update(score=float(t["score"]), max_score=float(t["max_score"]))
        tests.append(entry)
    lines = []
    if notes:
        lines += ["Your submission:", ""] + [f"- {sanitize.code(n)}" for n in notes] + [""]
    lines += ["| part | public tests passed | points on the public tests |", "|---|---|---|"]
    for p in view.get("parts", []):
        mine = [t for t in public if t.get("part") == p["part"]]
        weight = sum(float(t["max_score"]) for t in mine)  # ∝ the public weights: the hidden weight cancels
        got = float(p["max_points"]) * sum(float(t["score"]) for t in mine) / weight if weight else 0.0
        most = float(p["max_points"])  # (a rejected submission ran no test: 0 of the part's points)
        passed = sum(t.get("outcome") == "passed" for t in mine)
        lines.append(f"| {p['part']}. {sanitize.markdown(p['name'])} | {passed}/{len(mine)} | {_fmt(got)} / {_fmt(most)} |")
        f = p.get("first_failure") or {}
        if p.get("status") != "ok" and f.get("message") and not tests:
            lines.append(f"| | {sanitize.markdown(f['message'])} | |")
    if any_hidden:
        lines += ["", "Points on the public tests are what `make grade` shows: the share of the public tests' "
                  "weight that passed. Your grade also counts the hidden tests; their results and points are "
                  "shown when the grades are published."]
    if view.get("sandbox"):
        lines += ["", f"sandbox: {sanitize.markdown(view['sandbox'])}"]
    summary = output if output is not None else "\n".join(lines)
    if any_hidden:  # the grade would give the hidden points away: students see it when it is published
        tests.insert(0, {"name": "Public tests: summary", "number": "0",
                         "visibility": "visible", "output": summary, "output_format": "md", "tags": ["summary"]})
        for p in view.get("parts", []):  # the points, per part, published with the hidden tests
            tests.append({"name": f"Part {p['part']}: points (public and hidden tests)", "number": f"{p['part']}.p",
                          "score": float(p["points"]), "max_score": float(p["max_points"]),
                          "visibility": "after_published", "output": f"{p.get('passed', 0)}/{p.get('total', 0)} "
                          "tests passed", "tags": [f"part{p['part']}", "points"]})
    result: dict[str, Any] = {
        "score": float(view.get("total", 0.0)),
        "output": summary,
        "output_format": "md",
        "test_output_format": "text",
        "visibility": "after_published" if any_hidden else "visible",
        "stdout_visibility": "hidden",
        "tests": tests,
        "extra_data": {"hashes": view.get("hashes", {}), "sandbox": view.get("sandbox")},
    }
    if execution_time is not None:
        result["execution_time"] = round(execution_time, 1)
    return result

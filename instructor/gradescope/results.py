"""Gradescope's results.json from an engine report (the student view of instructor.batch).

Format (Gradescope autograder specification): top level `score`, `output` (+ `output_format`),
`visibility`, `stdout_visibility`, `execution_time`, and `tests`, each with `name`, `number`,
`score`, `max_score`, `status`, `visibility` and `output`. Public tests are "visible"; hidden
tests are "after_published" and their output is the engine's redacted message only (what was
checked and the hint, never inputs, values or the student's output).
"""
from __future__ import annotations

from typing import Any

VISIBILITY = {"public": "visible", "hidden": "after_published"}
OUTPUT_CHARS = 4000  # per test, Gradescope renders long outputs poorly


def _test_output(t: dict) -> str:
    text = str(t.get("message") or ("passed" if t.get("outcome") == "passed" else t.get("outcome", "")))
    if t.get("set") != "hidden" and t.get("output"):
        text += "\n\nyour code printed:\n" + str(t["output"])
    return text if len(text) <= OUTPUT_CHARS else text[:OUTPUT_CHARS] + "\n[... truncated]"


def results_json(view: dict, *, notes: list[str] | None = None, output: str | None = None,
                 execution_time: float | None = None) -> dict[str, Any]:
    """Gradescope results for one submission. `view` is a student view of an engine report."""
    tests = []
    numbers: dict[int, int] = {}
    for t in view.get("tests", []):
        part = int(t.get("part", 0))
        numbers[part] = numbers.get(part, 0) + 1
        tests.append({
            "name": f"Part {part}: {t['id']}",
            "number": f"{part}.{numbers[part]}",
            "score": float(t["score"]),
            "max_score": float(t["max_score"]),
            "status": "passed" if t.get("outcome") == "passed" else "failed",
            "visibility": VISIBILITY.get(t.get("set"), "after_published"),
            "output": _test_output(t),
            "tags": [f"part{part}", str(t.get("set"))],
        })
    lines = []
    if notes:
        lines += ["Your submission:"] + [f"- {n}" for n in notes] + [""]
    lines += ["| part | tests passed | points |", "|---|---|---|"]
    for p in view.get("parts", []):
        lines.append(f"| {p['part']}. {p['name']} | {p['passed']}/{p['total']} | {p['points']:g} / {p['max_points']:g} |")
        f = p.get("first_failure") or {}
        if p.get("status") != "ok" and f.get("message") and not tests:
            lines.append(f"| | {f['message']} | |")
    if view.get("sandbox"):
        lines += ["", f"sandbox: {view['sandbox']}"]
    result: dict[str, Any] = {
        "score": float(view.get("total", 0.0)),
        "output": output if output is not None else "\n".join(lines),
        "output_format": "md",
        "test_output_format": "text",
        "visibility": "visible",
        "stdout_visibility": "hidden",
        "tests": tests,
        "extra_data": {"hashes": view.get("hashes", {}), "status": view.get("status"),
                       "sandbox": view.get("sandbox")},
    }
    if execution_time is not None:
        result["execution_time"] = round(execution_time, 1)
    return result

"""Student-facing feedback from a report dict: a rich table on the terminal, or markdown text.

Both show the same content: per part, tests passed and points; then, for each part that did not
pass, ONE line if it is not implemented yet, else its first failure in detail (what was checked,
inputs, max abs/rel error and where, hint), followed by the list of EVERY failing test of the part:
its name and, for a public test, the one-line reason (a student with two bugs sees both). Hidden
tests arrive here already redacted by the engine, one entry per test function (which case failed
is not shown), and are listed by name and count only.
"""
from __future__ import annotations

from typing import Any

from . import sanitize


def _fmt_points(x: float) -> str:
    return f"{x:.2f}".rstrip("0").rstrip(".") if x != int(x) else str(int(x))


REASON_CHARS = 160


def one_line_reason(message: str) -> str:
    """The first line of a failure message, without its "checked: " label, cut to REASON_CHARS."""
    first = next((line.strip() for line in str(message).splitlines() if line.strip()), "")
    first = first.removeprefix("checked: ")
    return first if len(first) <= REASON_CHARS else first[:REASON_CHARS - 1] + "…"


def failing_lines(part: dict, tests: list[dict]) -> list[str]:
    """One line per failing test of the part: name, and the reason for a public test."""
    failing = [t for t in tests if t.get("part") == part["part"] and t.get("outcome") != "passed"]
    if len(failing) < 2:
        return []  # the detailed first failure says it all
    lines = [f"    failing tests ({len(failing)}):"]
    for t in failing:
        reason = f": {one_line_reason(t.get('message', ''))}" if t.get("set") == "public" and t.get("message") else ""
        if "cases" in t:  # a hidden test function, its cases folded (runner.hidden_by_function)
            reason = f" ({t['cases'] - t.get('passed', 0)} of {t['cases']} hidden cases failed)"
        lines.append(f"      - {t['id']}{reason}")
    return lines


def part_lines(part: dict, tests: list[dict] | None = None) -> list[str]:
    """The feedback lines of one part (empty when it passed); with the report's `tests`, also every
    failing test of the part."""
    head = f"Part {part['part']} ({part['name']})"
    ff = part.get("first_failure") or {}
    if part["status"] == "ok":
        return []
    if part["status"] == "not_implemented":
        fn = ff.get("function")
        what = f"{fn} raises NotImplementedError" if fn else "its functions raise NotImplementedError"
        return [f"{head}: not implemented yet — {what}"]
    if part["total"] == 0:
        return [f"{head}: no tests ran (see the grading problems below)"]
    lines = [f"{head}: {part['passed']}/{part['total']} tests passed; first failure: {ff.get('test', '?')}"]
    for line in str(ff.get("message", "")).splitlines() or [""]:
        lines.append(f"    {line}")
    return lines + failing_lines(part, tests or [])


def render_text(report: dict) -> str:
    """Markdown feedback (batch grading and nbgrader write this to a file)."""
    out = ["| part | name | tests passed | points |", "|---|---|---|---|"]
    for p in report["parts"]:
        out.append(f"| {p['part']} | {p['name']} | {p['passed']}/{p['total']} | "
                   f"{_fmt_points(p['points'])}/{_fmt_points(p['max_points'])} |")
    out.append(f"| | **total** | | **{_fmt_points(report['total'])}/{_fmt_points(report['max_total'])}** |")
    details = [line for p in report["parts"] for line in part_lines(p, report.get("tests"))]
    if details:  # a fence that no message can close (sanitize.fence)
        out += ["", sanitize.fence("\n".join(details))]
    if report.get("errors"):
        out += ["", "Grading problems:", *[f"- {sanitize.markdown(e)}" for e in report["errors"]]]
    return "\n".join(out) + "\n"


def print_report(report: dict, console: Any = None) -> None:
    """The table and the first failures, with rich."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = console or Console()
    table = Table(title="Grade", title_justify="left")
    table.add_column("part", justify="right")
    table.add_column("name")
    table.add_column("tests passed", justify="right")
    table.add_column("points", justify="right")
    style = {"ok": "green", "failed": "yellow", "not_implemented": "dim", "error": "red"}
    for p in report["parts"]:
        table.add_row(str(p["part"]), p["name"], f"{p['passed']}/{p['total']}",
                      f"{_fmt_points(p['points'])}/{_fmt_points(p['max_points'])}", style=style.get(p["status"]))
    table.add_section()
    table.add_row("", "total", "", f"{_fmt_points(report['total'])}/{_fmt_points(report['max_total'])}",
                  style="bold")
    console.print(table)
    for p in report["parts"]:
        lines = part_lines(p, report.get("tests"))
        if lines:
            console.print(Text("\n".join(lines)), soft_wrap=True)
    for e in report.get("errors", []):
        console.print(Text(f"grading problem: {e}", style="red"), soft_wrap=True)

"""`make grade`: grade an implementation folder and print the feedback.

    python -m autograder.grade --impl starter [--part 2] [--tests public|hidden|all] [--json PATH] [--jobs N]

Prints a table (part, tests passed, points), then the first failure of each part; writes the same
report as JSON (build/grade-report.json by default). Exits 0 only if every graded test passed.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m autograder.grade", description=__doc__.split("\n")[0])
    ap.add_argument("--impl", default="starter", help="folder with the graded files (default: starter)")
    ap.add_argument("--part", type=int, action="append", help="grade only this part (repeatable)")
    ap.add_argument("--tests", choices=["public", "hidden", "all"], default="public",
                    help="which test sets to run (default: public)")
    ap.add_argument("--json", type=Path, default=Path("build/grade-report.json"), help="where to write the report")
    ap.add_argument("--jobs", type=int, default=1,
                    help="grade the parts in up to N processes at once (default 1)")
    ap.add_argument("--show-hidden", action="store_true",
                    help="instructors: do not redact hidden-test failures in the feedback")
    args = ap.parse_args(argv)
    if args.jobs <= 1 and Path(args.impl).is_dir():
        from autograder.engine.processes import Zygote

        Zygote.prestart()  # its torch import overlaps the judge's (~0.5 s of a grade)

    from autograder.engine import grade_for_student
    from autograder.engine.feedback import print_report
    from autograder.engine.rubric import RubricError

    impl = Path(args.impl)
    if not impl.is_dir():
        print(f"error: {args.impl} is not a folder; use --impl starter, --impl solutions or your own folder",
              file=sys.stderr)
        return 2
    sets = ("public", "hidden") if args.tests == "all" else (args.tests,)
    try:
        report, view = grade_for_student(impl, parts=args.part, test_sets=sets, jobs=max(1, args.jobs),
                                         redact_sets=() if args.show_hidden else ("hidden",))
    except (RubricError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print_report(view)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"report: {args.json}  ({report['timing']['wall_s']:.1f} s)")
    all_passed = all(t["outcome"] == "passed" for t in report["tests"]) and not report["errors"] and report["tests"]
    return 0 if all_passed else 1


if __name__ == "__main__":
    sys.exit(main())

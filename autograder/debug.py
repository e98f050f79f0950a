"""`make debug PART=N`: run the first failing public test of part N in THIS process. Not a grade.

    python -m autograder.debug --impl starter --part 2 [--test test_forward_values]

`make grade` runs your code in a separate worker process with its input closed, so `breakpoint()`
there cannot stop (pdb reads end-of-file and quits: BdbQuit), and only the grader's summary of a
failure comes back. This command first asks the grader which public test of the part fails first
(the same run as `make grade PART=N`), then runs that one test again here: the same test function
on the same case, calling your functions directly in this process, so `breakpoint()`, pdb and
`print` work and an exception shows its full traceback through your code.

It is NOT a grade and not the grader: nothing is isolated (no worker, no time or memory limits, no
static checks), and a test that passes here can still fail under `make grade` (e.g. by a time
limit). Only `make grade` scores. Exit status: 0 once the test has run (whatever it found), 2 for
a bad argument.
"""
from __future__ import annotations

import argparse
import importlib
import sys
import traceback
import types
from pathlib import Path
from typing import Any

BANNER = "make debug: NOT A GRADE. One public test, run in this process so that breakpoint() and print work."


class LocalStudent:
    """The `student` a test gets, calling the implementation directly in this process.

    Arguments and results still go through the grader's plain-data encoding (as between judge and
    worker), so a test sees the same values here as under `make grade`."""

    def __init__(self, impl: Path, part: int, allowed: list[str], test_id: str) -> None:
        from autograder.engine.worker import PACKAGE, WorkerStudent

        self.impl, self.part, self.test_id, self.test_set = impl, part, test_id, "public"
        package = types.ModuleType(PACKAGE, f"the implementation folder {impl} (make debug)")
        package.__path__ = [str(impl)]
        for name in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
            del sys.modules[name]
        sys.modules[PACKAGE] = package
        self._worker = WorkerStudent(allowed)  # module() / function(): what scenarios get in the worker
        self._worker.allowed = set(allowed)

    hidden = False

    def with_timeout(self, seconds: float) -> "LocalStudent":
        return self  # no time limits here

    @staticmethod
    def _plain(value: Any, target: str) -> Any:
        from autograder.engine import protocol
        from autograder.engine.errors import StudentError

        try:
            tree, buffers = protocol.encode_value(value)
            return protocol.decode_value(tree, [bytes(b) for b in buffers])
        except protocol.ProtocolError as e:
            raise StudentError(f"{target} did not return plain data ({e})", kind="not_plain", target=target) from None

    def call(self, target: str, *args: Any, **kwargs: Any) -> Any:
        args, kwargs = self._plain(args, target), self._plain(kwargs, target)
        return self._plain(self._worker.function(target)(*args, **kwargs), target)

    def scenario(self, target: str, **kwargs: Any) -> Any:
        module, _, name = target.rpartition(".")
        fn = getattr(importlib.import_module(f"autograder.scenarios.{module}"), name)
        return self._plain(fn(self._worker, **self._plain(kwargs, target)), target)

    def source(self, filename: str) -> str:
        return (self.impl / filename).read_text(encoding="utf-8")


def first_failure(impl: Path, part: int, test: str | None) -> dict | None:
    """The report entry of the first public test of `part` that fails under the grader (or the
    first whose id contains `test`), None if there is none."""
    from autograder.engine import grade

    report = grade(impl, parts=[part], test_sets=("public",))
    for t in report["tests"]:
        if t["set"] == "public" and t["outcome"] != "passed" and (test is None or test in t["id"]):
            return t
    return None


def find_test(test_id: str):
    """(test function, case) for an id like 'public/test_part2_flash_forward.py::test_x[case-id]'."""
    from autograder.engine.cases import CASES_MARK, case_id

    path, _, name = test_id.split("/", 1)[-1].partition("::")
    func_name, _, param = name.partition("[")
    param = param.removesuffix("]")
    module = importlib.import_module(f"autograder.tests.{Path(path).stem}")
    fn = getattr(module, func_name)
    marks = [m for m in getattr(fn, "pytestmark", []) if m.name == CASES_MARK]
    if not marks:
        return fn, None
    for case in marks[0].args:
        if case_id(case) == param:
            return fn, case
    raise LookupError(f"case {param!r} of {func_name} not found in {path}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m autograder.debug", description=__doc__.split("\n")[0])
    ap.add_argument("--impl", default="starter", help="folder with your files (default: starter)")
    ap.add_argument("--part", type=int, help="the part (default: the first part with a failing test)")
    ap.add_argument("--test", default=None, help="the first failing test whose name contains this")
    args = ap.parse_args(argv)

    from autograder.engine.rubric import load_rubric

    from autograder.grade import UsageError, implementation_folder

    try:
        impl = implementation_folder(args.impl).resolve()
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rubric = load_rubric()
    if args.part is not None and args.part not in rubric.numbers:
        print(f"error: there is no part {args.part}; parts: {', '.join(map(str, rubric.numbers))}", file=sys.stderr)
        return 2
    print(BANNER)
    failure = None
    for part in [args.part] if args.part is not None else rubric.numbers:
        print(f"finding the first failing public test of part {part} (the grader, as make grade PART={part})...")
        failure = first_failure(impl, part, args.test)
        if failure is not None:
            break
        print(f"part {part}: every public test{' matching ' + repr(args.test) if args.test else ''} passes "
              f"under the grader; nothing to debug")
    if failure is None:
        return 0
    fn, case = find_test(failure["id"])
    print(f"running {failure['id']} here (it fails under the grader: {failure.get('message') or failure['outcome']})")
    if case is not None:
        print(f"case: {case!r}")
    import torch

    torch.set_num_threads(1)  # as in the grader's worker
    student = LocalStudent(impl, rubric.part(failure["part"]).number,
                           rubric.part(failure["part"]).reachable_modules(), failure["id"])
    try:
        fn(student, case) if case is not None else fn(student)
    except Exception as exc:  # noqa: BLE001 -- shown in full: this is a debugging aid
        from autograder.engine.checks import CheckFailure

        if isinstance(exc, CheckFailure):
            print(f"\nthe check fails here too:\n{exc}")
        else:
            print("\nyour code raised (full traceback):")
            traceback.print_exc(file=sys.stdout)
        print(f"\n{BANNER}\nFix, then `make grade PART={failure['part']}` for the score.")
        return 0
    print(f"\nthis test passes here, in this process; under the grader it did not ({failure.get('message')}).\n"
          "Differences: the grader's time and memory limits, its separate process and its static checks.\n"
          f"{BANNER}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One test function, two case lists: public cases beside the test, hidden cases with the instructor.

    @cases(AttnCase(...), AttnCase(...))            # the public cases, in autograder/tests/
    def test_forward_values(student, case): ...

    # instructor/hidden_tests/part2_flash_forward.py (never shipped):
    HIDDEN = {"test_forward_values": [AttnCase(..., seed=1), ...]}

The judge's plugin parametrizes `case` with the public list, plus the hidden list when the hidden
set is graded; each parametrization is marked with its test set. A check is written once, so a
rubric weight set on a test name applies to its public and hidden cases alike. A test may have no
public case (hidden only): without the hidden set it is not collected at all.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Callable

import pytest

CASES_MARK = "cases"
SET_MARK = "test_set"
NO_CASES_MARK = "no_cases"


def cases(*public: Any, diagnosis: Callable[[Any], str | None] | None = None) -> pytest.MarkDecorator:
    """Mark a test `def test_x(student, case)` with its public cases.

    diagnosis(student) -> hint text: the hint of a HIDDEN failure of the test. The judge runs it
    once per grade, before the first hidden test, and it calls the student only on the judge's own
    fixed probe inputs (runner.GradingPlugin.run_diagnoses), so the hint is the same for every hidden
    case of the test, whichever way each one failed. Public failures keep their check's hint."""
    return getattr(pytest.mark, CASES_MARK)(*public, **({"diagnosis": diagnosis} if diagnosis else {}))


def diagnosis_of(item: pytest.Item) -> Callable[[Any], str | None] | None:
    mark = item.get_closest_marker(CASES_MARK)
    return mark.kwargs.get("diagnosis") if mark is not None else None


def what_it_checks(function: Callable[..., Any] | None) -> str:
    """A test function's docstring, first paragraph, as one line: what a hidden failure says it checked."""
    doc = (getattr(function, "__doc__", None) or "").strip().split("\n\n", 1)[0] if function is not None else ""
    return " ".join(doc.split())


def case_id(case: Any) -> str:
    """A readable parametrization id: a case's `id`, or its fields joined by '-'."""
    if hasattr(case, "id"):
        return str(case.id)
    if isinstance(case, dict):
        return "-".join(case_id(v) for v in case.values())
    if isinstance(case, (tuple, list)):
        return "-".join(case_id(v) for v in case) or "empty"
    return str(case).replace(" ", "")


def hidden_module_path(hidden_dir: Path, test_file: Path) -> Path:
    """tests/test_part2_flash_forward.py -> hidden_dir/part2_flash_forward.py"""
    return Path(hidden_dir) / (Path(test_file).name.removeprefix("test_"))


_loaded: dict[tuple[Path, int, int], dict[str, list]] = {}


def hidden_cases(path: Path) -> dict[str, list]:
    """The HIDDEN dict of one hidden-cases file (trusted instructor code, run in the judge). Loaded once
    per version of the file (path, mtime, size): an instructor who edits it between two grades in one
    process gets the new cases."""
    path = Path(path).resolve()
    try:
        st = path.stat()
        key = (path, st.st_mtime_ns, st.st_size)
    except OSError:
        return {}
    if key not in _loaded:
        spec = importlib.util.spec_from_file_location(f"_hidden_cases_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        hidden = getattr(module, "HIDDEN", None)
        if not isinstance(hidden, dict):
            raise TypeError(f"{path}: a hidden-cases file defines HIDDEN = {{test name: [cases]}}")
        _loaded[key] = hidden
    return _loaded[key]


def parametrize(metafunc: pytest.Metafunc, sets: set[str], hidden_dir: Path | None) -> None:
    """pytest_generate_tests for one test function: its public and (if graded) hidden cases."""
    mark = metafunc.definition.get_closest_marker(CASES_MARK)
    if mark is None:
        return
    if "case" not in metafunc.fixturenames:
        raise TypeError(f"{metafunc.function.__name__}: a test marked with @cases takes a `case` argument")
    params = []
    if "public" in sets:
        params += [pytest.param(c, id=case_id(c), marks=getattr(pytest.mark, SET_MARK)("public")) for c in mark.args]
    if "hidden" in sets and hidden_dir is not None:
        hidden = hidden_cases(hidden_module_path(hidden_dir, metafunc.definition.path))
        params += [pytest.param(c, id=f"hidden-{case_id(c)}", marks=getattr(pytest.mark, SET_MARK)("hidden"))
                   for c in hidden.get(metafunc.function.__name__, [])]
    if not params:  # nothing to run in these sets: one placeholder that the plugin deselects
        params = [pytest.param(None, id="none", marks=getattr(pytest.mark, NO_CASES_MARK))]
    metafunc.parametrize("case", params)


def unknown_hidden_names(hidden_dir: Path, test_file: Path, functions: set[str]) -> list[str]:
    """Names in a hidden-cases file that no test function of the test file has (a typo would
    otherwise silently drop those cases)."""
    return sorted(set(hidden_cases(hidden_module_path(hidden_dir, test_file))) - functions)

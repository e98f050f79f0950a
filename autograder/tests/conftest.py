"""Assignment tests' conftest: part markers, and a stand-alone mode for test authors.

Under `python -m autograder.grade` (or autograder.engine.grade) the engine's plugin provides the
`student` fixture. For working on the tests themselves, plain pytest works too:

    .venv/bin/python -m pytest autograder/tests -p no:cacheprovider --impl solutions -m part1

which grades `--impl` (default: solutions/ where it exists, else starter/) with the public cases
through the same engine, and shows pytest's own output (add --hidden for the hidden cases).
"""
from __future__ import annotations

from pathlib import Path

import pytest

_TESTS_DIR = Path(__file__).resolve().parent


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--impl", default=None, help="implementation folder to test (stand-alone mode)")
    parser.addoption("--hidden", action="store_true", help="also the hidden cases (instructor copy only)")


def pytest_configure(config: pytest.Config) -> None:
    from autograder.engine.rubric import load_rubric
    from autograder.engine.runner import GradingPlugin

    # The judge's reference math is small; one thread avoids oversubscribing the cores the
    # worker (and, in batch grading, other submissions) use. Measured: part 4's judge-side checks
    # 6 s with one thread against 44 s with two on a loaded 2-core machine.
    import torch

    torch.set_num_threads(1)
    rubric = load_rubric()
    for part in rubric.parts:
        config.addinivalue_line("markers", f"{part.marker}: tests of part {part.number} ({part.name})")
    if any(isinstance(p, GradingPlugin) for p in config.pluginmanager.get_plugins()):
        return  # run by the engine
    root = _TESTS_DIR.parent.parent
    impl = config.getoption("--impl", default=None) or str(root / "solutions" if (root / "solutions").is_dir()
                                                           else root / "starter")
    config.pluginmanager.register(_standalone_plugin(config, rubric, impl), "autograder-standalone")


def _standalone_plugin(config: pytest.Config, rubric, impl: str):
    import tempfile

    from autograder.engine import static
    from autograder.engine.judge import Engine, Limits, prepare_submission
    from autograder.engine.runner import DEFAULT_HIDDEN_DIR, GradingPlugin

    tmp = Path(tempfile.mkdtemp(prefix="grade-standalone-"))
    sub = prepare_submission(Path(impl), rubric.all_files(), tmp)
    refused = {}
    for part in rubric.parts:
        found = [v for f in part.files if f in sub.present
                 for v in static.violations(sub.present[f], f, numpy_allowed=part.numpy_allowed)]
        if found:
            refused[part.number] = static.refusal(found)
    engine = Engine(sub, rubric, Limits().updated(**rubric.defaults), None, refused)
    sets = ("public", "hidden") if config.getoption("--hidden") else ("public",)
    plugin = GradingPlugin(engine, rubric, rubric.numbers, _TESTS_DIR, test_sets=sets,
                           hidden_dir=DEFAULT_HIDDEN_DIR if DEFAULT_HIDDEN_DIR.is_dir() else None)

    def close() -> None:
        engine.close()
        sub.cleanup()

    config.add_cleanup(close)
    return plugin

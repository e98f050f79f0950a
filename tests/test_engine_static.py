"""Engine self-tests: static source rules, the rubric, and the dependency analysis."""
from __future__ import annotations

from pathlib import Path

import pytest

from autograder.engine import deps, static
from autograder.engine.rubric import RubricError, load_rubric

ROOT = Path(__file__).resolve().parent.parent

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("source,expected", [
    ("import numpy as np\n", "imports numpy"),
    ("from numpy import exp\n", "imports numpy"),
    ("x = t.numpy()\n", "uses numpy"),
    ("y = torch.from_numpy(a)\n", "uses numpy"),
    ("m = __import__('numpy')\n", "imports numpy"),
    ("o = torch.nn.functional.scaled_dot_product_attention(q, k, v)\n", "scaled_dot_product_attention"),
    ("from torch.nn.functional import scaled_dot_product_attention\n", "scaled_dot_product_attention"),
    ("f = getattr(F, 'scaled_dot_product_attention')\n", "scaled_dot_product_attention"),
    ("from torch.utils._python_dispatch import TorchDispatchMode\n", "dispatch"),
    ("import sys\nsys.modules['torch'] = None\n", "sys.modules"),
    ("import builtins\n", "builtins"),
    ("__builtins__['len'] = 1\n", "__builtins__"),
    ("torch.allclose = lambda *a: True\n", "monkeypatching"),
    ("setattr(torch, 'allclose', f)\n", "monkeypatching"),
    ("import autograder.engine\n", "imports the grader"),
    ("import ctypes\n", "ctypes"),
])
def test_violations_are_found_with_their_line(source, expected):
    found = static.violations("import torch\n" + source, "f.py", numpy_allowed=False)
    assert found and expected in found[0] and found[0].startswith("f.py:")
    assert static.refusal(found).startswith("refused: f.py:")


def test_numpy_allowed_where_the_rubric_says_so():
    assert static.violations("import numpy as np\nx = np.zeros(3)\n", "k.py", numpy_allowed=True) == []


def test_no_false_positives_on_the_solutions_and_the_starter():
    rubric = load_rubric()
    for folder in ("solutions", "starter"):
        for part in rubric.parts:
            for f in part.files:
                path = REPO / folder / f
                if path.exists():
                    assert static.violations(path.read_text(), f, numpy_allowed=part.numpy_allowed) == [], (folder, f)


def test_rubric_is_the_assignment():
    rubric = load_rubric()
    assert [(p.number, p.points, p.marker) for p in rubric.parts] == [
        (1, 15, "part1"), (2, 20, "part2"), (3, 15, "part3"), (4, 20, "part4"), (5, 15, "part5"), (6, 15, "part6")]
    assert rubric.max_total == 100
    assert rubric.all_files() == sorted(["online_softmax.py", "flash_forward.py", "flash_kernel.py",
                                         "flash_backward.py", "kv_cache.py", "flash_decoding.py"])
    for part in rubric.parts:  # every weight names a test function that exists
        sources = "".join(p.read_text() for p in (REPO / "autograder" / "tests").rglob(f"test_part{part.number}_*.py"))
        for name in part.weights:
            assert f"def {name}(" in sources, (part.number, name)


def test_bad_rubrics_are_refused(tmp_path):
    for text in ("", "[[part]]\nnumber = 1\n", '[[part]]\nnumber=1\nname="a"\npoints=1\nfiles=["../x.py"]\n',
                 '[[part]]\nnumber=1\nname="a"\npoints=1\nfiles=["a.py"]\n[[part]]\nnumber=1\nname="b"\npoints=1\nfiles=["b.py"]\n'):
        path = tmp_path / "r.toml"
        path.write_text(text)
        with pytest.raises(RubricError):
            load_rubric(path)


def test_reach_follows_relative_imports():
    rubric = load_rubric()
    sources = {
        "flash_forward.py": "import torch\n",
        "flash_backward.py": "from .flash_forward import flash_forward\n",
        "flash_decoding.py": "from . import online_softmax\n",
        "online_softmax.py": "",
    }
    assert deps.reach(rubric, 4, sources) == {"flash_backward.py", "flash_forward.py"}
    assert deps.parts_reaching(rubric, {"flash_forward.py"}, sources) == [2, 4]
    assert deps.parts_reaching(rubric, {"online_softmax.py"}, sources) == [1, 6]


@pytest.mark.parametrize("line", [
    "import _graded_submission.flash_decoding as k",
    "from _graded_submission.flash_decoding import helper",
    "from _graded_submission import flash_decoding",
    "import _graded_submission\nk = _graded_submission.flash_decoding",
    "import importlib\nk = importlib.import_module('_graded_submission.flash_decoding')",
    "import sys\nk = sys.modules['_graded_submission.flash_decoding']",
])
def test_reach_follows_absolute_imports_and_any_mention(line):
    """An outside attacker's: part 1's file ran flash_decoding.py through `import _graded_submission.
    flash_decoding`, which reach did not see, and took another submission's part-1 result (engine/reuse.py)
    although its own flash_decoding.py behaved otherwise. Every mention of a graded module counts."""
    rubric = load_rubric()
    sources = {"online_softmax.py": line + "\n", "flash_decoding.py": ""}
    assert {"online_softmax.py", "flash_decoding.py"} <= deps.reach(rubric, 1, sources)


@pytest.mark.parametrize("line", [
    "import importlib\nk = importlib.import_module(__package__ + '.flash_dec' + 'oding')",
    "k = __import__('_graded_submission.flash_' + 'decoding')",
    "import sys\nk = sys.modules['_graded_submission.flash_' + 'decoding']",
    "text = open(__file__.replace('online_softmax', 'flash_' + 'decoding')).read()",
    "from pathlib import Path\ntext = Path('flash_' + 'decoding.py').read_text()",
    "import numpy as np\nx = np.loadtxt('flash_' + 'decoding.py')",
    "k = ().__class__.__base__.__subclasses__()",
    "k = getattr(__builtins__, 'ev' + 'al')('1')",
    "import fileinput, sys\ntext = ''.join(fileinput.input(files=(sys.path[0] + '/flash_deco' + 'ding.py',)))",
    "from configparser import ConfigParser\nConfigParser().read('flash_deco' + 'ding.py')",
    "import numpy as np\nx = np.fromregex('flash_deco' + 'ding.py', 'x', float)",
    "import torch\nx = torch.from_file('flash_deco' + 'ding.py')",
    "from course.tiny_transformer import load_checkpoint\nload_checkpoint('flash_deco' + 'ding.py')",
])
def test_a_file_that_can_reach_another_by_a_computed_name_reaches_every_graded_file(line):
    """An outside hostile student: a shared part-1 file imported flash_decoding.py by a name it computed
    (`importlib.import_module(__package__ + "." + "flash_dec" + "oding")`), so reach did not see it, and a
    colluder's correct flash_decoding.py gave a starter's flash_decoding.py 15/15 in part 1 through the
    batch's reuse. Any way to reach a file by a computed name (imports by name, exec, the builtins,
    reflection, reading files) makes the part reach every graded file: it is keyed by all of them. A second
    tester read the file with fileinput, which no list of readers had: any import outside the modules the
    assignment computes with counts too."""
    rubric = load_rubric()
    sources = {"online_softmax.py": line + "\n", "flash_decoding.py": ""}
    assert deps.dynamic(line)
    assert deps.reach(rubric, 1, sources) == set(rubric.all_files())


def test_the_solutions_and_the_starter_reach_only_what_they_import():
    """The rule costs honest code nothing: no file of solutions/ or starter/ names a DYNAMIC name."""
    for folder in ("solutions", "starter"):
        for f in (ROOT / folder).glob("*.py"):
            assert not deps.dynamic(f.read_text()), f

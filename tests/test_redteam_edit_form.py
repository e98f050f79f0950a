"""The red-team corpus's base + edits form (instructor/redteam/README.md, redteam.apply_edits): an attack
file names a base of solutions/ or starter/ and holds only the top-level definitions it replaces or adds.
Replacing keeps every other byte of the base; added names follow the base; a missing base or name is ONE
line from the command line; and the assembled corpus is Python that parses, attack by attack. Fast (no
grading): the corpus is graded by tests/test_redteam*.py."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from autograder.grade import run_cli
from instructor import redteam
from instructor.redteam import EditError, apply_edits

BASE = '''"""A base file."""
import math


# the base's comment about f
def f(x):
    return x + 1
    ### END SOLUTION


@staticmethod
def g(x):
    return math.sqrt(x)


N = 3
'''


@pytest.fixture
def root(tmp_path, monkeypatch) -> Path:
    """A repository root whose solutions/base.py is BASE."""
    (tmp_path / "solutions").mkdir()
    (tmp_path / "solutions" / "base.py").write_text(BASE)
    monkeypatch.setattr(redteam, "ROOT", tmp_path)
    return tmp_path


def test_a_replaced_definition_takes_the_place_of_the_bases_and_every_other_byte_stays(root):
    attack = '''# redteam-base: solutions/base.py
# a note, not copied


def f(x):  # the attack's f
    return x - 1


# a comment of the attack's N: it goes with it
N = 4
'''
    assert apply_edits(attack, "a.py") == BASE.replace(
        "def f(x):\n    return x + 1\n    ### END SOLUTION\n", "def f(x):  # the attack's f\n    return x - 1\n"
    ).replace("N = 3\n", "# a comment of the attack's N: it goes with it\nN = 4\n")


def test_a_decorated_definition_is_replaced_with_its_decorators(root):
    attack = "# redteam-base: solutions/base.py\n\ndef g(x):\n    return 0\n"
    assert apply_edits(attack, "a.py") == BASE.replace("@staticmethod\ndef g(x):\n    return math.sqrt(x)\n",
                                                       "def g(x):\n    return 0\n")


def test_added_definitions_follow_the_base_in_the_files_order(root):
    attack = '''# redteam-base: solutions/base.py
# redteam-add: h, K

def h(x):
    return f(x) * K


def f(x):
    return 0

# K's comment
K = 2'''
    out = apply_edits(attack, "a.py")
    assert out.startswith(BASE.replace("    return x + 1\n    ### END SOLUTION\n", "    return 0\n"))
    assert out.endswith("N = 3\n\n\ndef h(x):\n    return f(x) * K\n\n\n# K's comment\nK = 2\n")


@pytest.mark.parametrize("attack, want", [
    ("# redteam-base: solutions/nope.py\n\ndef f(x):\n    pass\n", "base 'solutions/nope.py' is not a file of"),
    ("# redteam-base: course/reference.py\n\ndef f(x):\n    pass\n", "is not a file of solutions/ or starter/"),
    ("# redteam-base: solutions/../solutions/base.py\n\ndef f(x):\n    pass\n", "is not a file of"),
    ("# no base line\n\ndef f(x):\n    pass\n", "base '' is not a file of"),
    ("# redteam-base: solutions/base.py\n\ndef typo(x):\n    pass\n",
     "a.py:3: cannot replace typo: solutions/base.py does not define it (list a new name in '# redteam-add:')"),
    ("# redteam-base: solutions/base.py\n# redteam-add: h\n\ndef f(x):\n    pass\n",
     "h is in '# redteam-add:' but the file does not define it"),
    ("# redteam-base: solutions/base.py\n# redteam-add: g\n\ndef g(x):\n    pass\n", "g is in '# redteam-add:' but"),
    ("# redteam-base: solutions/base.py\n\ndef f(x):\n    pass\n\n\ndef f(x):\n    pass\n", "f is defined twice"),
    ("# redteam-base: solutions/base.py\n\nprint(1)\n", "a.py:3: not a definition of one name"),
    ("# redteam-base: solutions/base.py\n\ndef f(x):\n    pass\n\n# a stray comment\n", "a.py:6: a line outside"),
])
def test_an_edit_that_cannot_apply_is_one_clear_line(root, attack, want):
    with pytest.raises(EditError) as e:
        apply_edits(attack, "a.py")
    assert want in str(e.value) and "\n" not in str(e.value)


def test_assemble_stops_with_one_line_naming_the_file(tmp_path, monkeypatch, capsys):
    from instructor.redteam.__main__ import main

    corpus = tmp_path / "corpus"
    (corpus / "bad").mkdir(parents=True)
    (corpus / "bad" / "ATTACK.toml").write_text('file = "flash_forward.py"\npart = 2\n')
    (corpus / "bad" / "flash_forward.py").write_text("# redteam-base: solutions/flash_forwardd.py\n\nX = 1\n")
    monkeypatch.setattr(redteam, "HERE", corpus)
    assert run_cli(main, ["assemble", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [f"error: {corpus / 'bad' / 'flash_forward.py'}: base 'solutions/flash_forwardd.py' "
                                "is not a file of solutions/ or starter/"], err


def test_every_assembled_attack_is_python_and_the_edit_form_leaves_no_header(tmp_path):
    corpus = redteam.assemble(tmp_path, honest=False)
    edit_form = [f for f in redteam.HERE.glob("*/*.py") if f.read_text(encoding="utf-8").startswith(redteam.BASE)]
    assert edit_form, "no attack file in the edit form: this test checks nothing"
    for name in corpus:
        for f in sorted((tmp_path / name).glob("*.py")):
            text = f.read_text(encoding="utf-8")
            ast.parse(text, filename=str(f))
            assert "# redteam-base:" not in text and "# redteam-add:" not in text, f

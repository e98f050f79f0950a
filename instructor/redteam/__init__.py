"""The red-team corpus (see README.md here): attacks on the grader, and honest submissions to
grade next to them. `python -m instructor.redteam assemble DIR` writes the full corpus."""
from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
MARK = "# ---- red-team attack (instructor/redteam): everything below is the attack ----\n"
HONEST_MUTATION = "forward_no_rescale"  # from instructor/mutations, applied to honest_wrong when present

# honest_wrong's part-1 mistake: merge_partial adds the partial outputs without rescaling them.
HONEST_PART1_BUG = '''

# An honest mistake (red-team corpus, honest_wrong): the outputs are added without rescaling them
# to the common max, so merge_partial is wrong whenever the two maxima differ.
def merge_partial(a, b):
    (ma, la, oa), (mb, lb, ob) = a, b
    return torch.maximum(ma, mb), la + lb, oa + ob
'''


def attacks() -> dict[str, dict]:
    """{attack name: its ATTACK.toml}, sorted."""
    out = {}
    for d in sorted(HERE.iterdir()):
        if (d / "ATTACK.toml").is_file():
            out[d.name] = tomllib.loads((d / "ATTACK.toml").read_text(encoding="utf-8"))
    return out


def _graded_files() -> list[str]:
    from ..intake import all_graded_files

    return all_graded_files()


def _apply_mutation(folder: Path, name: str) -> bool:
    """Apply instructor/mutations/<name>.toml in place to `folder`; False if there is no such mutation."""
    from .. import catalogue

    path = ROOT / "instructor" / "mutations" / f"{name}.toml"
    if not path.is_file():
        return False
    catalogue.apply_edits(catalogue.load_mutation(path), folder)
    return True


def assemble(dest: Path, *, honest: bool = True) -> dict[str, dict]:
    """Write every attack (laid over the current starter) and the honest submissions into `dest`.
    Returns {submission name: {"kind": "attack"|"honest", ...}}; an attack's ATTACK.toml `kind`
    (cheat or harm) is under "goal"."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    files = _graded_files()
    corpus: dict[str, dict] = {}
    for name, spec in attacks().items():
        d = dest / name
        d.mkdir()
        for f in files:
            if (ROOT / "starter" / f).is_file():
                shutil.copyfile(ROOT / "starter" / f, d / f)
        src = HERE / name
        for f in sorted(src.iterdir()):
            if f.name == "ATTACK.toml" or f.is_dir():
                continue
            text = f.read_text(encoding="utf-8")
            if f.name == spec.get("file") and MARK in text:  # the attack block over the CURRENT starter
                block = text.split(MARK, 1)[1]
                text = (ROOT / "starter" / f.name).read_text(encoding="utf-8").rstrip("\n") + "\n\n\n" + MARK + block
            (d / f.name).write_text(text, encoding="utf-8")
        corpus[name] = {**spec, "kind": "attack", "goal": spec.get("kind")}  # goal: cheat | harm
    if honest:
        for name, base in (("honest_solutions", "solutions"), ("honest_starter", "starter"), ("honest_wrong", "solutions")):
            d = dest / name
            d.mkdir()
            for f in files:
                if (ROOT / base / f).is_file():
                    shutil.copyfile(ROOT / base / f, d / f)
            corpus[name] = {"kind": "honest", "base": base}
        wrong = dest / "honest_wrong"
        with (wrong / "online_softmax.py").open("a", encoding="utf-8") as fh:
            fh.write(HONEST_PART1_BUG)
        corpus["honest_wrong"]["mutation"] = HONEST_MUTATION if _apply_mutation(wrong, HONEST_MUTATION) else None
    return corpus


def grade_part(job: tuple[str, int]) -> dict:
    """grade(folder, parts=[part]) with public and hidden tests: one job of the measurement test's pool
    (a module-level function, so that spawned processes can run it)."""
    from autograder.engine.runner import grade

    folder, part = job
    return grade(folder, parts=[part], test_sets=("public", "hidden"))


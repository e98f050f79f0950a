"""The rubric (autograder/rubric.toml): parts, points, markers, graded files, weights, limits."""
from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_RUBRIC = Path(__file__).resolve().parent.parent / "rubric.toml"
_FILE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\.py$")


class RubricError(ValueError):
    pass


@dataclass(frozen=True)
class Part:
    number: int
    name: str
    points: float
    marker: str
    files: list[str]
    uses: list[str] = field(default_factory=list)  # other graded files its tests may call directly
    numpy_allowed: bool = False
    weights: dict[str, float] = field(default_factory=dict)  # test function name -> weight (default 1)
    limits: dict[str, Any] = field(default_factory=dict)  # overrides of engine.judge.Limits
    cost: float = 1.0  # relative grading time; only orders the parts when grading in parallel

    def reachable_modules(self) -> list[str]:
        """Module names the part's tests may call or a scenario may open."""
        return sorted({f.removesuffix(".py") for f in [*self.files, *self.uses]})

    def weight(self, function_name: str) -> float:
        return float(self.weights.get(function_name, 1.0))


@dataclass(frozen=True)
class Rubric:
    parts: list[Part]
    defaults: dict[str, Any]
    path: Path

    @property
    def numbers(self) -> list[int]:
        return [p.number for p in self.parts]

    def part(self, number: int) -> Part:
        for p in self.parts:
            if p.number == number:
                return p
        raise RubricError(f"the rubric has no part {number} (parts: {self.numbers})")

    def part_of_marker(self, marker: str) -> Part | None:
        for p in self.parts:
            if p.marker == marker:
                return p
        return None

    def all_files(self) -> list[str]:
        return sorted({f for p in self.parts for f in p.files})

    @property
    def max_total(self) -> float:
        return float(sum(p.points for p in self.parts))


def load_rubric(path: str | Path | None = None) -> Rubric:
    path = Path(path or DEFAULT_RUBRIC)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise RubricError(f"cannot read the rubric {path}: {e}") from None
    parts = []
    for i, raw in enumerate(data.get("part", [])):
        where = f"{path.name}: [[part]] #{i + 1}"
        try:
            part = Part(
                number=int(raw["number"]), name=str(raw["name"]), points=float(raw["points"]),
                marker=str(raw.get("marker", f"part{raw['number']}")), files=[str(f) for f in raw["files"]],
                uses=[str(f) for f in raw.get("uses", [])], numpy_allowed=bool(raw.get("numpy_allowed", False)),
                weights={str(k): float(v) for k, v in raw.get("weights", {}).items()},
                limits=dict(raw.get("limits", {})), cost=float(raw.get("cost", 1.0)),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise RubricError(f"{where}: missing or bad field ({e}); see autograder/README.md") from None
        for f in [*part.files, *part.uses]:
            if not _FILE.match(f):
                raise RubricError(f"{where}: {f!r} is not a plain Python file name")
        if part.points < 0 or any(w < 0 for w in part.weights.values()):
            raise RubricError(f"{where}: points and weights must be >= 0")
        parts.append(part)
    numbers = [p.number for p in parts]
    if not parts or len(set(numbers)) != len(numbers) or len({p.marker for p in parts}) != len(parts):
        raise RubricError(f"{path.name}: parts must exist and have distinct numbers and markers")
    return Rubric(parts=sorted(parts, key=lambda p: p.number), defaults=dict(data.get("limits", {})), path=path)

"""What `effvision search` explores and optimises: `--space KEY=SPEC` entries over any recipe key
and `--objectives` read from a trial's report.json. Everything here is checked against the recipe
before a study is opened, so a misspelt key or an empty range costs one line and writes nothing.

SPEC grammar (Optuna's distributions):
  LO:HI[:STEP]          float, uniform (a step makes it discrete)
  int:LO:HI[:STEP]      integer
  log:LO:HI             float, log-uniform (LO > 0)
  choice:A,B,...        one of the values (each read as YAML: numbers, words, true/false, null)
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import yamlio
from ..errors import EffvisionError
from ..recipe import RecipeError, recipe_from_raw, with_value


@dataclass(frozen=True)
class Dimension:
    key: str  # the recipe key, also the Optuna parameter's name
    spec: str  # as the user wrote it (stored with the study)
    kind: str  # float, int, log or choice
    low: float | None = None
    high: float | None = None
    step: float | None = None
    choices: tuple = ()

    def suggest(self, trial) -> Any:
        if self.kind == "choice":
            return trial.suggest_categorical(self.key, list(self.choices))
        if self.kind == "int":
            return trial.suggest_int(self.key, int(self.low), int(self.high), step=int(self.step or 1))
        return trial.suggest_float(self.key, self.low, self.high, step=self.step, log=self.kind == "log")

    def probes(self) -> list:
        """Values that stand for the range when the recipe is checked: its ends and a middle
        (a float range over an integer key fails at the middle)."""
        if self.kind == "choice":
            return list(self.choices)
        if self.kind == "int":
            return [int(self.low), int(self.high)]
        middle = math.sqrt(self.low * self.high) if self.kind == "log" else (self.low + self.high) / 2
        if self.step:
            middle = self.low + round((middle - self.low) / self.step) * self.step
        return [self.low, middle, self.high]


def parse_space(entry: str) -> Dimension:
    """One `--space KEY=SPEC` entry."""
    where = f"--space {entry}"
    key, eq, spec = entry.partition("=")
    key, spec = key.strip(), spec.strip()
    if not eq or not key or not spec:
        raise EffvisionError(
            f"{where}: expected KEY=SPEC, e.g. stages.prune.ratio=0.2:0.8 or data.image_size=choice:64,96"
        )
    kind, _, rest = spec.partition(":")
    if kind == "choice":
        values = [v.strip() for v in rest.split(",") if v.strip()]
        if not values:
            raise EffvisionError(f"{where}: the choice is empty; give values, e.g. choice:minmax,percentile")
        try:
            choices = tuple(yamlio.load(v) for v in values)
        except yamlio.YAMLError:
            raise EffvisionError(f"{where}: a choice is not a plain value (numbers, words, true/false)") from None
        if any(c is not None and not isinstance(c, (bool, int, float, str)) for c in choices):
            raise EffvisionError(f"{where}: choices must be numbers, words, true/false or null")
        if len(set(map(repr, choices))) != len(choices):
            raise EffvisionError(f"{where}: a choice is repeated")
        return Dimension(key, spec, "choice", choices=choices)
    if kind in ("int", "log"):
        parts = rest.split(":")
    else:
        kind, parts = "float", spec.split(":")
    if len(parts) not in (2, 3) or (kind == "log" and len(parts) != 2):
        form = {"int": "int:LO:HI[:STEP]", "log": "log:LO:HI", "float": "LO:HI[:STEP]"}[kind]
        raise EffvisionError(f"{where}: expected {form} (or choice:A,B,...)")
    try:
        numbers = [int(p) if kind == "int" else float(p) for p in parts]
    except ValueError:
        want = "integers" if kind == "int" else "numbers"
        raise EffvisionError(f"{where}: the range's bounds must be {want}") from None
    if not all(math.isfinite(n) for n in numbers):
        raise EffvisionError(f"{where}: the range's bounds must be finite")
    low, high = numbers[:2]
    step = numbers[2] if len(numbers) == 3 else None
    if not low < high:
        raise EffvisionError(f"{where}: the range is empty (LO must be below HI)")
    if step is not None and not 0 < step <= high - low:
        raise EffvisionError(f"{where}: the step must be above 0 and at most HI - LO")
    if kind == "log" and low <= 0:
        raise EffvisionError(f"{where}: a log range needs LO > 0")
    return Dimension(key, spec, kind, low, high, step)


def check_space(dims: list[Dimension], raw: dict, file: str | Path) -> None:
    """Every key is a key of this recipe, and every value the range stands for makes a valid
    recipe: a misspelt key says which key was meant (the recipe's own validation)."""
    keys = [d.key for d in dims]
    if len(set(keys)) != len(keys):
        raise EffvisionError(
            f"--space: a key is given twice ({', '.join(sorted({k for k in keys if keys.count(k) > 1}))})"
        )
    for d in dims:
        for value in d.probes():
            try:
                recipe_from_raw(with_value(raw, d.key, value, f"--space {d.key}"), file)
            except RecipeError as exc:
                whole = d.kind == "float" and float(d.low).is_integer() and float(d.high).is_integer()
                hint = f" (for whole numbers write int:{d.low:g}:{d.high:g})" if whole else ""
                raise EffvisionError(f"--space {d.key}={d.spec}: at {value!r}: {exc}{hint}") from None


# name: (direction, what it is)
OBJECTIVES = {
    "top1": ("maximize", "top-1 of the shipped file in its runtime, on the whole validation split"),
    "latency_ms": ("minimize", "p50 of the shipped file on the recipe's target backend and batch"),
    "speedup": ("maximize", "reference p50 / shipped p50, timed interleaved in one process"),
    "size": ("minimize", "size of the shipped file in MB"),
}
NEEDS_BENCH = {"latency_ms", "speedup"}


def parse_objectives(value: str) -> list[str]:
    names = [v.strip() for v in value.split(",") if v.strip()]
    if not names:
        raise EffvisionError(f"--objectives {value!r}: name at least one of {', '.join(OBJECTIVES)}")
    for n in names:
        if n not in OBJECTIVES:
            close = difflib.get_close_matches(n, list(OBJECTIVES), n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise EffvisionError(f"--objectives: unknown objective '{n}'{hint} (choices: {', '.join(OBJECTIVES)})")
    if len(set(names)) != len(names):
        raise EffvisionError(f"--objectives {value}: an objective is named twice")
    return names


def check_objectives(objectives: list[str], recipe) -> None:
    """A latency objective needs a bench stage that times the shipped file (and, for a speed-up,
    the reference beside it)."""
    bench = next((s for s in recipe.stages if s.type == "bench"), None)
    needs = [o for o in objectives if o in NEEDS_BENCH]
    if needs and bench is None:
        raise EffvisionError(f"{recipe._source}: --objectives {','.join(needs)} needs a bench stage in the recipe")
    if "speedup" in objectives and not bench.reference:
        raise EffvisionError(
            f"{recipe._source}: --objectives speedup needs the bench stage's reference (reference: true)"
        )

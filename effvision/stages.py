"""Every stage type, registered: importing this module fills STAGES (the pipeline and the CLI do).

Recipe validation asks STAGES for each stage's config, so a recipe is loaded through here
(`effvision.load_recipe` is this module's): the stage modules sit above effvision.recipe, and
only a module at their level may import them.

For effvision.compress, each stage type's config is also here under its own name with its type
filled in (`Prune(ratio=0.5)` is the recipe entry `{type: prune, ratio: 0.5}`): the same typed
config, validated the same way."""

from pydantic import create_model

from .compression import plan as _plan  # noqa: F401  (registers plan)
from .compression import qat_stage as _qat  # noqa: F401  (registers qat)
from .compression import quantize_stage as _quantize  # noqa: F401  (registers quantize)
from .compression import stages as _compress  # noqa: F401  (registers select, prune, distill)
from .deploy import stages as _deploy  # noqa: F401  (registers export, evaluate, bench)
from .recipe import load_recipe, validate_recipe
from .registry import STAGES
from .train import stage as _train  # noqa: F401  (registers train)


def _typed(kind: str):
    base = STAGES.get(kind).config
    return create_model(kind.capitalize(), __base__=base, __module__=__name__, type=(str, kind))


# Every stage type in the order a recipe runs them (the reference docs list them so).
IN_PIPELINE_ORDER = ("select", "train", "plan", "prune", "distill", "quantize", "qat", "export", "evaluate", "bench")
Select, Train, Plan, Prune, Distill, Quantize, Qat, Export, Evaluate, Bench = (_typed(k) for k in IN_PIPELINE_ORDER)

__all__ = [
    "load_recipe",
    "validate_recipe",
    "Select",
    "Train",
    "Plan",
    "Prune",
    "Distill",
    "Quantize",
    "Qat",
    "Export",
    "Evaluate",
    "Bench",
]

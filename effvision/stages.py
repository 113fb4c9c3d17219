"""Every stage type, registered: importing this module fills STAGES (the pipeline and the CLI do).

Recipe validation asks STAGES for each stage's config, so a recipe is loaded through here
(`effvision.load_recipe` is this module's): the stage modules sit above effvision.recipe, and
only a module at their level may import them."""

from .compress import qat_stage as _qat  # noqa: F401  (registers qat)
from .compress import stages as _compress  # noqa: F401  (registers select, prune, distill, quantize)
from .deploy import stages as _deploy  # noqa: F401  (registers export, evaluate, bench)
from .recipe import load_recipe, validate_recipe
from .train import stage as _train  # noqa: F401  (registers train)

__all__ = ["load_recipe", "validate_recipe"]

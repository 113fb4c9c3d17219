"""Where every choice of a run is scored: the decision split (data.holdout; data/decision.py), never
the validation split the report prints. The plan's levers, pruning candidates and where pruning
stops, batch-norm statistics kept or recomputed, int8 reverts and int8-or-fp32, the floor they hold,
an accuracy control's ranking: each reads `ctx.decisions` (this object) and nothing else."""

from __future__ import annotations

from pathlib import Path

import torch

from ..progress import log


def resized(loader, size: int):
    """The loader's batches at `size` (bicubic, antialiased): what a lower input size sees."""
    for x, y in loader:
        if x.shape[-1] != size:
            x = torch.nn.functional.interpolate(x, size=(size, size), mode="bicubic", antialias=True)
        yield x, y


class Decisions:
    """Scores on the decision split of the run's data (`ctx.data`; the teacher's size is
    `ctx.full_data`'s): files at their own input size, in their runtime; models in torch."""

    def __init__(self, ctx):
        self.ctx = ctx

    def loader(self, n: int | None = None, seed: int = 0, full: bool = False):
        """The decision split (or a stratified n of it), as the model being compressed sees it
        (full: at the data's own size, as the uncompressed model does)."""
        data = self.ctx.full_data if full else self.ctx.data
        return data.decision_loader(n, seed)

    def where(self, n: int | None = None) -> str:
        split = self.ctx.data.decision
        if split is None:
            return "no decision split"
        return (
            f"{self.ctx.data.decision_size(n)} training images held out for decisions (of {split.of}), never trained on"
        )

    def score_file(self, path, n: int | None = None) -> float:
        """Top-1 of a file, run in its runtime, at its own input size."""
        from ..deploy import evaluate
        from ..runtimes import runtime_of_path

        shape = runtime_of_path(path).input_shape(path)
        return evaluate(path, self._at_size(int(shape[-1]), n) if len(shape) == 4 else self.loader(n))

    def _at_size(self, size: int, n: int | None):
        """Images at `size` as the report's data at that size has them (decoded at it), else resized."""
        for full in (False, True):
            data = self.ctx.full_data if full else self.ctx.data
            if data.input_size[-1] == size:
                return self.loader(n, full=full)
        return resized(self.loader(n, full=True), size)

    def scorer(self, n: int | None = None):
        """score_file on n samples, as a one-argument function."""
        return lambda path: self.score_file(path, n)

    def score_model(self, model, n: int | None = None, seed: int = 0) -> float:
        """Top-1 of a torch model on the decision split as the model being compressed sees it."""
        from ..scoring import accuracy, torch_predictor

        device = next(model.parameters()).device
        return accuracy(torch_predictor(model.eval(), device), self.loader(n, seed))

    def reference_accuracy(self, runtime, model, shape: list[int]) -> float:
        """The uncompressed model's top-1 as an fp32 file of `runtime` at its own size: what a
        target's floor is measured from."""
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            path = runtime.export(model, Path(tmp) / f"reference{runtime.suffix}", list(shape))
            accuracy = self.score_file(path)
        return accuracy


def floor_of(ctx, own: float | None, runtime):
    """The Floor an int8 step holds (int8.Floor, or None without one): the stage's own max_drop
    against the file it quantizes; else the recipe target's max_drop against the uncompressed model
    (scored on the decision split as an fp32 file of `runtime`), so that pruning's loss and int8's
    together hold it."""
    from ..deploy.reference import reference_model
    from ..int8 import Floor

    target = ctx.recipe.target
    if own is not None:
        return Floor(own)
    if target is None or target.max_drop is None:
        return None
    reference = reference_model(ctx)
    if reference is None:  # nothing compressed before: the file quantized is the uncompressed model
        return Floor(target.max_drop)
    accuracy = ctx.decisions.reference_accuracy(runtime, reference, ctx.full_input_shape)
    log(
        f"  int8 holds the target's floor: at most {target.max_drop} below the uncompressed model's {accuracy:.4f} "
        f"({ctx.decisions.where()})"
    )
    return Floor(target.max_drop, accuracy)

"""PyTorch itself as a runtime: a torch model (a module, an effvision checkpoint or a zoo card name),
run eagerly or compiled by inductor; what the file runtimes are compared with."""

from __future__ import annotations

from ..errors import EffvisionError
from ..registry import RUNTIMES
from .base import Runtime, Session, Target


@RUNTIMES.register("torch")
class TorchModels(Runtime):
    kind, describes, label, rank = "model", "a torch model", "PyTorch model", 9
    targets = (
        Target("torch-eager", {"cpu": ("fp32", "bf16"), "cuda": ("fp32", "tf32", "bf16", "fp16", "int8", "float8")}),
        # inductor; on the CPU weights are frozen (constant-folded and pre-packed), which int8 needs
        Target(
            "torch-compile",
            {"cpu": ("fp32", "bf16", "int8"), "cuda": ("fp32", "tf32", "bf16", "fp16", "int8", "float8")},
        ),
    )
    packages = ()

    def check_backend(self, name):
        if name not in (None, self.default_backend):  # torch-compile is timed, not a predictor
            raise EffvisionError(f"--backend {name} does not run {self.describes} (use {self.default_backend})")
        return self.default_backend

    def open(self, model, device="cpu", threads=None, spinning=True):
        """A module, or a checkpoint or card name loaded as one; numpy in, numpy out."""
        import numpy as np
        import torch

        from ..models import load_model
        from ..scoring import torch_predictor

        if not isinstance(model, torch.nn.Module):
            model = load_model(str(model))
        if threads:
            torch.set_num_threads(threads)
        predict = torch_predictor(model, torch.device(device))
        return Session(lambda x: predict(torch.from_numpy(np.ascontiguousarray(x))).cpu().numpy())

"""Feature distillation beside the logit loss: the student's intermediate feature maps matched to
the teacher's at the same layers, through learned 1x1 adapters (FitNets, Romero et al. 2015)
and/or as spatial attention maps (attention transfer, Zagoruyko & Komodakis 2017).

The layers are the teacher's `feature_info` modules where it has them (timm models), else, from
one probe batch, the last module to produce each feature-map size (the end of every stage), kept
where the student has a module of the same name whose output differs at most in channels. A
pruned student is the teacher's own architecture, so its names match."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import EffvisionError
from .config import FeatureDistillSettings


def _feature_info_layers(teacher: nn.Module) -> list[str]:
    info = getattr(teacher, "feature_info", None)
    if not isinstance(info, (list, tuple)):
        return []
    return [f["module"] for f in info if isinstance(f, dict) and f.get("module")]


def _output_shapes(model: nn.Module, sample: torch.Tensor) -> dict[str, tuple]:
    """Each named module's output shape on `sample`, in the order the modules finished (a block
    after the layers inside it); modules that return no single tensor are left out."""
    shapes, handles = {}, []
    for name, module in model.named_modules():
        if name:

            def hook(_m, _i, out, name=name):
                if isinstance(out, torch.Tensor):
                    shapes.pop(name, None)  # a module called twice counts at its last call
                    shapes[name] = tuple(out.shape)

            handles.append(module.register_forward_hook(hook))
    training = model.training
    model.eval()  # the probe must not move batch-norm statistics
    try:
        with torch.no_grad():
            model(sample)
    finally:
        model.train(training)
        for h in handles:
            h.remove()
    return shapes


def _matches(s: tuple, t: tuple) -> bool:
    """Student and teacher features that differ at most in channels (dim 1), with room to match."""
    return len(s) == len(t) >= 3 and s[0] == t[0] and s[2:] == t[2:]


def choose_layers(student: nn.Module, teacher: nn.Module, names, sample: torch.Tensor):
    """(layers, shapes of student and teacher features, where the names came from)."""
    t_shapes, s_shapes = _output_shapes(teacher, sample), _output_shapes(student, sample)
    if names:
        source = "recipe"
        for n in names:
            if n not in t_shapes or n not in s_shapes:
                raise EffvisionError(f"features.layers: {n!r} is not a module that outputs a tensor in both models")
            if not _matches(s_shapes[n], t_shapes[n]):
                raise EffvisionError(
                    f"features.layers: {n!r} outputs {s_shapes[n]} in the student and {t_shapes[n]} in the teacher; "
                    "feature maps must differ only in channels"
                )
    else:
        names = [n for n in _feature_info_layers(teacher) if n in s_shapes and _matches(s_shapes[n], t_shapes[n])]
        source = "feature_info"
        if not names:
            source = "hooks"
            names = _stage_ends(teacher, t_shapes, s_shapes)
        if not names:
            raise EffvisionError(
                "feature distillation: no layer of the teacher has a feature map the student matches; "
                "name them with features.layers"
            )
    return list(names), {n: s_shapes[n] for n in names}, {n: t_shapes[n] for n in names}, source


def _stage_ends(teacher: nn.Module, t_shapes: dict, s_shapes: dict) -> list[str]:
    """The last block (a module holding layers) to output each feature-map size, in finishing
    order, where the student's differs only in channels. Blocks, not layers: a layer inside a
    block can be a convolution before its normalisation, whose raw maps a pruned student matched
    badly (speednet: attention loss 6.1 against about 0.1 at the blocks' outputs); a network of
    bare layers falls back to them."""
    blocks = {n for n, m in teacher.named_modules() if n and next(m.children(), None) is not None}
    for pool in (blocks, set(t_shapes)):
        last_at_size: dict[tuple, str] = {}
        for n, shape in t_shapes.items():  # finishing order: a stage's block ends after its layers
            spatial = shape[2:]
            if n in pool and len(shape) >= 3 and math.prod(spatial) > 1:
                last_at_size.pop(spatial, None)
                last_at_size[spatial] = n
        names = [n for n in last_at_size.values() if n in s_shapes and _matches(s_shapes[n], t_shapes[n])]
        if names:
            return names
    return []


def _adapter(dims: int, c_in: int, c_out: int) -> nn.Module:
    conv = {3: nn.Conv1d, 4: nn.Conv2d, 5: nn.Conv3d}.get(dims)
    if conv is None:
        raise EffvisionError(f"feature distillation: {dims}-D feature maps are not supported (3-D to 5-D are)")
    return conv(c_in, c_out, 1, bias=False)


def _attention(f: torch.Tensor) -> torch.Tensor:
    """Zagoruyko & Komodakis's spatial attention: the channel mean of squared activations,
    flattened and L2-normalised per sample."""
    return F.normalize(f.float().pow(2).mean(1).flatten(1), dim=1)


def _per_sample(loss: torch.Tensor, batch: int) -> torch.Tensor:
    """Mean per sample; features that fold frames into the batch (N*T first) fold back."""
    return loss.reshape(batch, -1).mean(1)


class FeatureDistiller(nn.Module):
    """Hooks that keep the chosen layers' outputs of student and teacher on every forward, and
    the adapters (trained with the student) that map student channels to teacher channels."""

    def __init__(self, student: nn.Module, teacher: nn.Module, s: FeatureDistillSettings, sample: torch.Tensor):
        super().__init__()
        self.settings = s
        self.layers, s_shapes, t_shapes, self.source = choose_layers(student, teacher, s.layers, sample)
        self.adapters = nn.ModuleList(
            _adapter(len(s_shapes[n]), s_shapes[n][1], t_shapes[n][1]) if s.method != "attention" else nn.Identity()
            for n in self.layers
        ).to(sample.device)
        self._student: dict[str, torch.Tensor] = {}
        self._teacher: dict[str, torch.Tensor] = {}
        modules_s, modules_t = dict(student.named_modules()), dict(teacher.named_modules())
        self._handles = []
        for n in self.layers:
            self._handles.append(modules_s[n].register_forward_hook(self._keep(self._student, n)))
            self._handles.append(modules_t[n].register_forward_hook(self._keep(self._teacher, n)))

    @staticmethod
    def _keep(store: dict, name: str):
        def hook(_m, _i, out):
            store[name] = out

        return hook

    def loss(self, batch: int) -> torch.Tensor:
        """Per-sample feature loss of the last student and teacher forwards, summed over layers."""
        s, total = self.settings, 0.0
        for n, adapter in zip(self.layers, self.adapters, strict=True):
            f_s, f_t = self._student.pop(n), self._teacher.pop(n).detach().float()
            if f_s.dim() == 4 and f_s.shape[2:] != f_t.shape[2:]:  # a student at a lower input size
                f_s = nn.functional.interpolate(f_s, size=f_t.shape[2:], mode="bilinear", align_corners=False)
            if s.method in ("fitnet", "both"):
                total = total + s.weight * _per_sample((adapter(f_s.float()) - f_t).pow(2), batch)
            if s.method in ("attention", "both"):
                diff = (_attention(f_s) - _attention(f_t)).pow(2)
                total = total + s.attention_weight / 2 * _per_sample(diff, batch)
        return total

    def record(self) -> dict:
        return {"method": self.settings.method, "layers": self.layers, "from": self.source}

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

"""The training loop's parts: timm's optimizers with a faster head, the learning-rate schedules,
the distillation loss, frozen modules, and how training batches are made, moved and resized."""

from __future__ import annotations

import contextlib
import math
import time
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..device import synchronize
from ..errors import EffvisionError
from .config import TrainSettings

_TIMM_OPT = {
    "sgd": "sgd",
    "nesterov": "nesterov",
    "momentum": "momentum",
    "adamw": "adamw",
    "lamb": "lamb",
    "lars": "lars",
}


def make_optimizer(model: nn.Module, s: TrainSettings) -> torch.optim.Optimizer:
    """timm's optimizers: weight decay is skipped for biases and norm layers, and LARS/LAMB adapt
    only the decayed (weight) tensors, as their papers do."""
    from timm.optim import create_optimizer_v2

    kwargs = {"momentum": s.momentum} if s.optimizer in ("sgd", "nesterov", "momentum", "lars") else {}
    name = ("lookahead_" if s.lookahead else "") + _TIMM_OPT[s.optimizer]
    opt = create_optimizer_v2(model, opt=name, lr=s.lr, weight_decay=s.weight_decay, **kwargs)
    if s.head_lr_scale != 1.0:
        _split_head(opt, model, s.lr, s.head_lr_scale)
    return opt


def _split_head(opt: torch.optim.Optimizer, model: nn.Module, lr: float, scale: float) -> None:
    """Move the classifier's parameters into groups of their own at `scale` x the learning rate
    (`lr_scale` tells the schedule). Before the first step, so no optimizer state moves."""
    from ..models.adapters import classifier_of

    head = classifier_of(model)
    if head is None:
        raise EffvisionError("head_lr_scale: the model has no classifier layer to scale")
    head_ids = {id(p) for p in head.parameters()}
    for group in list(opt.param_groups):
        moved = [p for p in group["params"] if id(p) in head_ids]
        if moved:
            group["params"] = [p for p in group["params"] if id(p) not in head_ids]
            opt.add_param_group({**{k: v for k, v in group.items() if k != "params"}, "params": moved})
            opt.param_groups[-1].update(lr=lr * scale, lr_scale=scale)
    opt.param_groups[:] = [g for g in opt.param_groups if g["params"]]


def frozen_modules(model: nn.Module, names: list[str]) -> list[nn.Module]:
    """The modules `freeze` names (a name or a dotted prefix of one); an unknown name is an error
    listing the model's top-level modules."""
    found, named = [], dict(model.named_modules())
    for name in names:
        hits = [m for n, m in named.items() if n == name or n.startswith(name + ".")]
        if not hits:
            top = ", ".join(n for n, _ in model.named_children())
            raise EffvisionError(f"freeze: the model has no module '{name}' (its top-level modules: {top})")
        found.append(named[name] if name in named else hits[0])
    return found


@contextlib.contextmanager
def frozen(model: nn.Module, names: list[str]):
    """`names` take no gradient while the stage trains; their parameters train again afterwards
    (later stages fine-tune the whole model)."""
    params = [p for m in frozen_modules(model, names) for p in m.parameters() if p.requires_grad]
    for p in params:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in params:
            p.requires_grad_(True)


def make_schedule(opt: torch.optim.Optimizer, s: TrainSettings, steps_per_epoch: int):
    total = max(1, s.epochs * steps_per_epoch)
    warm = min(total - 1, int(s.warmup_epochs * steps_per_epoch))
    if s.schedule == "onecycle" and total >= 4:
        # Each of OneCycleLR's two phases must last at least one step (it divides by their length).
        return torch.optim.lr_scheduler.OneCycleLR(
            opt,
            max_lr=[s.lr * g.get("lr_scale", 1.0) for g in opt.param_groups],
            total_steps=total,
            pct_start=min(max(warm, 2), total - 2) / total,
            anneal_strategy="linear",
            cycle_momentum=False,
        )

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        if s.schedule == "constant":
            return 1.0
        if s.schedule == "step":  # x0.1 at half and three quarters of training
            return 0.1 ** sum(step >= total * f for f in (0.5, 0.75))
        if s.schedule == "onecycle":  # too few steps for two phases: a linear decay
            return 1 - (step - warm) / max(1, total - warm + 1)
        return 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, total - warm)))

    return torch.optim.lr_scheduler.LambdaLR(opt, factor)


def autocast_dtype(s: TrainSettings, device: torch.device) -> Optional[torch.dtype]:
    if s.amp == "off" or (s.amp == "auto" and device.type != "cuda"):
        return None  # bf16 autocast on most CPUs is slower than fp32
    if s.amp == "fp16":
        return torch.float16
    return torch.bfloat16 if s.amp == "bf16" or torch.cuda.is_bf16_supported() else torch.float16


def distill_loss(
    student: torch.Tensor,
    teacher: torch.Tensor,
    target: torch.Tensor,
    temperature: float,
    alpha: float,
    smoothing: float,
) -> torch.Tensor:
    """Hinton et al. 2015, per sample: alpha * T^2 * KL(teacher_T || student_T) + (1 - alpha) * CE."""
    soft = F.kl_div(
        F.log_softmax(student / temperature, 1),
        F.log_softmax(teacher / temperature, 1),
        reduction="none",
        log_target=True,
    ).sum(1)
    return alpha * temperature**2 * soft + (1 - alpha) * F.cross_entropy(
        student, target, label_smoothing=smoothing, reduction="none"
    )


def hardest(losses: torch.Tensor, fraction: float) -> torch.Tensor:
    """Indices of the highest-loss `fraction` of a batch (at least one sample)."""
    return losses.topk(max(1, math.ceil(fraction * len(losses)))).indices


def check_tricks(s: TrainSettings, data) -> None:
    """The image tricks need images (mirror averaging also suits video); say so before any work."""
    used = ["tensor_data"] if s.tensor_data and data.modality == "video" else []
    used += [k for k in ("whiten", "progressive_sizes") if getattr(s, k)]
    if data.modality != "image" and used:
        raise EffvisionError(
            f"{', '.join(used)}: training options for images (tensor_data also for points), the data is {data.modality}"
        )
    if s.tta_flip and (data.modality == "points" or not data.card.hflip):
        why = (
            "the data is points"
            if data.modality == "points"
            else f"dataset {data.name} says a mirrored sample is another class (hflip: false)"
        )
        raise EffvisionError(f"tta_flip averages each sample with its mirror; {why}")


def train_batches(
    data, s: TrainSettings, device: torch.device, seed: int, rank: int, world: int, resumable: bool = False
):
    """This rank's training batches: made a whole batch at a time where the data allows it (and
    tensor_data is not false), else by the per-sample DataLoader (its workers started each epoch
    when the training is resumable: see train_loader)."""
    bs = max(1, (s.batch_size or data.config.batch_size) // world)  # batch_size is the global batch
    if s.tensor_data is not False:
        batches = data.batched_train_loader(
            bs, device, seed=seed, translate=s.translate, rank=rank, world=world, required=bool(s.tensor_data)
        )
        if batches is not None:
            return batches
    return data.train_loader(bs, seed=seed, with_index=True, rank=rank, world=world, persistent=not resumable)


def data_path(loader) -> str:
    """How the training batches were made, for the report."""
    return getattr(loader, "path", None) or f"per-sample DataLoader, {loader.num_workers} workers"


def set_epoch(loader, epoch: int) -> None:
    for obj in (getattr(loader, "sampler", None), loader):
        if hasattr(obj, "set_epoch"):
            obj.set_epoch(epoch)
            return


def epoch_size(s: TrainSettings, epoch: int) -> Optional[int]:
    """The image size of this epoch under progressive resizing (None: as loaded)."""
    sizes = s.progressive_sizes
    return sizes[min(len(sizes) - 1, epoch * len(sizes) // max(1, s.epochs))] if sizes else None


def to_device(x: torch.Tensor, device: torch.device, memory) -> torch.Tensor:
    """A batch on the training device; images (4-D) in the loop's memory format."""
    return x.to(device, non_blocking=True, memory_format=memory) if x.dim() == 4 else x.to(device, non_blocking=True)


def resize(x: torch.Tensor, size: Optional[int], memory) -> torch.Tensor:
    if size is None or x.shape[-1] == size:
        return x
    return F.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False).contiguous(
        memory_format=memory
    )


def mirror_averaged(predict: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    """Test-time augmentation: the mean of the logits of each input and its left-right mirror."""
    return lambda x: (predict(x) + predict(x.flip(-1))) / 2


def whitening_sample(data, n: int = 4096) -> torch.Tensor:
    """Up to n training images as the model sees them at evaluation (normalised)."""
    loader = data.train_eval_loader(range(min(n, len(data.train))), batch_size=512)
    return torch.cat([x for x, _ in loader])


def warm_compiled(step_fn, model: nn.Module, loader, s: TrainSettings, dtype, device: torch.device, memory) -> float:
    """Compile the training step (forward + backward at every size it will see) on one batch,
    then restore the weights and statistics: returns the seconds compilation took."""
    t = time.perf_counter()
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    x, y, _ = next(iter(loader))
    x, y = to_device(x, device, memory), y.to(device)
    for size in sorted(set(s.progressive_sizes or [None]), key=lambda v: v or 0):
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = F.cross_entropy(step_fn(resize(x, size, memory)).float(), y)
        loss.backward()
    model.zero_grad(set_to_none=True)
    model.load_state_dict(saved)
    synchronize(device)
    return time.perf_counter() - t

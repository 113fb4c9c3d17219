"""The one training loop: classification, or distillation from a teacher, for every modality.

Time-to-accuracy (DAWNBench's metric) is the training wall-clock, evaluation passes excluded
(airbench's convention), until validation top-1 first reaches the target.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..evaluate import accuracy, torch_predictor
from ..progress import log, progress_bar
from .config import TrainSettings

_TIMM_OPT = {"sgd": "sgd", "nesterov": "nesterov", "momentum": "momentum", "adamw": "adamw", "lamb": "lamb", "lars": "lars"}


@dataclass
class FitResult:
    accuracy: float
    history: list[dict] = field(default_factory=list)
    wall_s: float = 0.0
    train_s: float = 0.0
    time_to_accuracy_s: Optional[float] = None
    epochs_to_accuracy: Optional[int] = None


def make_optimizer(model: nn.Module, s: TrainSettings) -> torch.optim.Optimizer:
    from timm.optim import create_optimizer_v2

    kwargs = {"momentum": s.momentum} if s.optimizer in ("sgd", "nesterov", "momentum", "lars") else {}
    return create_optimizer_v2(model, opt=_TIMM_OPT[s.optimizer], lr=s.lr, weight_decay=s.weight_decay, **kwargs)


def make_schedule(opt: torch.optim.Optimizer, s: TrainSettings, steps_per_epoch: int):
    total = max(1, s.epochs * steps_per_epoch)
    warm = min(total - 1, int(s.warmup_epochs * steps_per_epoch))
    if s.schedule == "onecycle" and total >= 4:
        # Each of OneCycleLR's two phases must last at least one step (it divides by their length).
        return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=s.lr, total_steps=total, pct_start=min(max(warm, 2), total - 2) / total,
                                                   anneal_strategy="linear", cycle_momentum=False)

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        if s.schedule == "constant":
            return 1.0
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


def distill_loss(student: torch.Tensor, teacher: torch.Tensor, target: torch.Tensor, temperature: float, alpha: float, smoothing: float) -> torch.Tensor:
    """Hinton et al. 2015, per sample: alpha * T^2 * KL(teacher_T || student_T) + (1 - alpha) * CE."""
    soft = F.kl_div(F.log_softmax(student / temperature, 1), F.log_softmax(teacher / temperature, 1), reduction="none", log_target=True).sum(1)
    return alpha * temperature**2 * soft + (1 - alpha) * F.cross_entropy(student, target, label_smoothing=smoothing, reduction="none")


def hardest(losses: torch.Tensor, fraction: float) -> torch.Tensor:
    """Indices of the highest-loss `fraction` of a batch (at least one sample)."""
    return losses.topk(max(1, math.ceil(fraction * len(losses)))).indices


def fit(model: nn.Module, data, s: TrainSettings, device: torch.device, seed: int = 0, teacher: nn.Module | None = None,
        temperature: float = 4.0, alpha: float = 0.9, label: str = "train",
        on_batch: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None] | None = None) -> FitResult:
    """Train model in place on data (a DatasetBundle); evaluates on val after every epoch.

    Samples are weighted by data.train_weights when a weighted coreset was selected. With
    s.hard_fraction, each batch is forwarded without gradients and only its highest-loss fraction
    is trained on (selective backprop, Jiang et al. 2019). on_batch(indices, logits, targets) sees
    every training batch's logits (forgetting statistics)."""
    torch.manual_seed(seed)
    memory = torch.channels_last if s.channels_last else torch.contiguous_format
    model.to(device, memory_format=memory)
    if teacher is not None:
        teacher.to(device, memory_format=memory).eval()
    loader = data.train_loader(s.batch_size, seed=seed, with_index=True)
    weights = data.train_weights
    val_loader = data.val_loader()
    opt = make_optimizer(model, s)
    sched = make_schedule(opt, s, len(loader))
    dtype = autocast_dtype(s, device)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    ema = None
    if s.ema:
        from timm.utils import ModelEmaV3

        ema = ModelEmaV3(model, decay=s.ema_decay)
    selective = s.hard_fraction is not None and s.hard_fraction < 1

    def batch_losses(inputs: torch.Tensor, targets: torch.Tensor, grad: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.set_grad_enabled(grad):
            out = model(inputs)
            if teacher is None:
                return out, F.cross_entropy(out, targets, label_smoothing=s.label_smoothing, reduction="none")
            with torch.no_grad():
                t_out = teacher(inputs)
            return out, distill_loss(out.float(), t_out.float(), targets, temperature, alpha, s.label_smoothing)

    result = FitResult(accuracy=0.0)
    start = time.perf_counter()
    eval_s = 0.0
    with progress_bar() as bar:
        task = bar.add_task(label, total=s.epochs * len(loader), info="") if bar else None
        for epoch in range(s.epochs):
            model.train()
            loss_sum, seen = 0.0, 0
            for x, y, idx in loader:
                x = x.to(device, non_blocking=True, memory_format=memory) if x.dim() == 4 else x.to(device, non_blocking=True)
                y = y.to(device, non_blocking=True)
                w = None if weights is None else weights[idx].to(device)
                with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
                    out, per_sample = batch_losses(x, y, grad=not selective)
                    if on_batch is not None:
                        on_batch(idx, out.detach(), y)
                    if selective:
                        keep = hardest(per_sample.float() * (1 if w is None else w), s.hard_fraction)
                        x, y, w = x[keep], y[keep], None if w is None else w[keep]
                        out, per_sample = batch_losses(x, y)
                    loss = per_sample.mean() if w is None else (per_sample * w).sum() / w.sum()
                opt.zero_grad(set_to_none=True)
                scaler.scale(loss).backward()
                if s.grad_clip:
                    scaler.unscale_(opt)
                    nn.utils.clip_grad_norm_(model.parameters(), s.grad_clip)
                scaler.step(opt)
                scaler.update()
                sched.step()
                if ema is not None:
                    ema.update(model)
                loss_sum += loss.item() * len(y)
                seen += len(y)
                if bar:
                    bar.update(task, advance=1, info=f"epoch {epoch + 1}/{s.epochs} loss {loss_sum / seen:.3f}")
            t_eval = time.perf_counter()
            acc = accuracy(torch_predictor(ema.module if ema else model, device, s.channels_last), val_loader)
            eval_s += time.perf_counter() - t_eval
            train_s = time.perf_counter() - start - eval_s
            result.history.append({"epoch": epoch + 1, "loss": loss_sum / max(seen, 1), "val_accuracy": acc, "train_s": round(train_s, 3), "lr": opt.param_groups[0]["lr"]})
            log(f"  {label} epoch {epoch + 1:>3}/{s.epochs}  loss {loss_sum / max(seen, 1):.4f}  val top-1 {acc:.4f}  ({train_s:.1f}s)")
            if s.target_accuracy is not None and result.time_to_accuracy_s is None and acc >= s.target_accuracy:
                result.time_to_accuracy_s, result.epochs_to_accuracy = round(train_s, 3), epoch + 1
            result.accuracy = acc
    if ema is not None:
        model.load_state_dict(ema.module.state_dict())
    if s.epochs == 0:
        result.accuracy = accuracy(torch_predictor(model, device), val_loader)
    result.wall_s = time.perf_counter() - start
    result.train_s = result.wall_s - eval_s
    model.to(memory_format=torch.contiguous_format).eval()
    return result

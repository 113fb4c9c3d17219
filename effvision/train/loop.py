"""The one training loop: classification, or distillation from a teacher, for every modality.

Time-to-accuracy (DAWNBench's metric) is the training wall-clock, evaluation passes excluded
(airbench's convention), until validation top-1 first reaches the target.
"""

from __future__ import annotations

import contextlib
import functools
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..device import synchronize
from ..progress import log, progress_bar
from ..scoring import accuracy, torch_predictor
from . import checkpoint as ckpt
from . import distributed
from .checkpoint import EpochCheckpoint
from .config import LogitDistillSettings, TrainSettings
from .features import FeatureDistiller
from .parts import (
    autocast_dtype,
    check_tricks,
    data_path,
    distill_loss,
    epoch_size,
    frozen,
    frozen_modules,
    hardest,
    make_optimizer,
    make_schedule,
    mirror_averaged,
    resize,
    set_epoch,
    to_device,
    train_batches,
    warm_compiled,
    whitening_sample,
)
from .whiten import whiten_first_conv


@dataclass
class FitResult:
    accuracy: float  # of the trained model as it ships (no test-time mirror averaging)
    history: list[dict] = field(default_factory=list)
    wall_s: float = 0.0
    train_s: float = 0.0
    eval_s: float = 0.0
    compile_s: float = 0.0
    checkpoint_s: float = 0.0  # writing epoch checkpoints (not training time)
    time_to_accuracy_s: Optional[float] = None
    epochs_to_accuracy: Optional[float] = None
    accuracy_tta: Optional[float] = None  # with tta_flip: the mirror-averaged accuracy the target is checked on
    stopped: Optional[str] = None  # "target" or "time limit" when training ended early
    processes: int = 1
    max_param_difference: Optional[float] = None  # across ranks after multi-process training (0 when in sync)
    features: Optional[dict] = None  # the layers feature distillation matched, and how they were chosen
    data_path: str = ""  # how training batches were made (data_path())
    samples: int = 0  # training samples stepped on (this process)
    resumed_from_epoch: Optional[int] = None  # the epochs an epoch checkpoint had finished before this process

    def metrics(self, s: TrainSettings) -> dict:
        """What a training stage records beside accuracy and time-to-accuracy."""
        out = {
            "target_accuracy": s.target_accuracy,
            "epochs_to_accuracy": self.epochs_to_accuracy,
            "stopped": self.stopped,
            "train_s": round(self.train_s, 3),
            "eval_s": round(self.eval_s, 3),
            "compile_s": round(self.compile_s, 3),
            "checkpoint_s": round(self.checkpoint_s, 3),
            "resumed_from_epoch": self.resumed_from_epoch,
            "processes": self.processes,
            "data": {
                "path": self.data_path,
                "train_samples_per_s": round(self.samples / self.train_s, 1) if self.train_s > 0 else None,
            },
            "history": self.history,
        }
        if self.accuracy_tta is not None:
            out["accuracy_tta"] = self.accuracy_tta
        if self.features is not None:
            out["features"] = self.features
        if self.max_param_difference is not None:
            out["max_param_difference_across_ranks"] = self.max_param_difference
        return out


def _training_modes(fn: Callable) -> Callable:
    """fit() runs with the modules in s.freeze frozen (no gradient, batch-norm statistics fixed)
    and with autograd on, whatever mode the caller is in."""

    @functools.wraps(fn)
    def run(model: nn.Module, data, s: TrainSettings, *args, **kwargs) -> FitResult:
        with frozen(model, s.freeze), torch.enable_grad():
            return fn(model, data, s, *args, **kwargs)

    return run


@_training_modes
def fit(
    model: nn.Module,
    data,
    s: TrainSettings,
    device: torch.device,
    seed: int = 0,
    teacher: nn.Module | None = None,
    distill: LogitDistillSettings | None = None,
    label: str = "train",
    on_batch: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None] | None = None,
    after_backward: Callable[[], None] | None = None,
    checkpoint: EpochCheckpoint | None = None,
    student_size: int | None = None,
) -> FitResult:
    """Train model in place on data (a DatasetBundle); evaluates on val after every epoch.

    With student_size (an input size a plan stage lowered the model to), the model sees every
    batch, training and validation, resized to it, while the teacher sees the data's own size.

    With a teacher, the loss is distillation's (distill: temperature, alpha, and with features
    also the intermediate features' loss, features.py). Samples are weighted by
    data.train_weights when a weighted coreset was selected. With
    s.hard_fraction, each batch is forwarded without gradients and only its highest-loss fraction
    is trained on (selective backprop, Jiang et al. 2019). on_batch(indices, logits, targets) sees
    every training batch's logits (forgetting statistics); after_backward() runs on each batch's
    unscaled gradients before the optimiser steps (a regulariser's). Under torchrun the model trains as
    DistributedDataParallel, each process on its share of every batch.

    With a checkpoint, the loop's whole state is saved after every checkpoint.every epochs and
    after the last (rank 0 writes), and a training that finds one of this model continues after its
    last finished epoch (every rank from the same file): it ends as an uninterrupted one would.
    Callers whose on_batch or after_backward keep state of their own pass no checkpoint.

    Training seconds exclude evaluation and compilation (DAWNBench's and airbench's convention);
    whitening and data augmentation count."""
    hooks = (on_batch, after_backward)
    run = _Training(model, data, s, device, seed, teacher, distill, label, hooks, checkpoint, student_size)
    first_epoch = run.resume()
    last_epoch = first_epoch if run.result.stopped else s.epochs
    # the feature hooks come off the student and teacher however the loop ends (an interrupt, an error)
    hooks = contextlib.closing(run.features) if run.features is not None else contextlib.nullcontext()
    with progress_bar() as bar, hooks:
        total, done_steps = s.epochs * len(run.loader), first_epoch * len(run.loader)
        task = bar.add_task(label, total=total, completed=done_steps, info="") if bar else None
        for epoch in range(first_epoch, last_epoch):
            if run.end_epoch(epoch, *run.train_epoch(epoch, bar, task)):
                break
    return run.finish()


class _Training:
    """One call of fit: everything it sets up, in the order the random state is drawn (the
    seed, the batches, the feature probe), one epoch's steps, its evaluation and record."""

    def __init__(self, model, data, s, device, seed, teacher, distill, label, hooks, checkpoint, student_size):
        torch.manual_seed(seed)
        check_tricks(s, data)
        self.model, self.data, self.s, self.device, self.teacher, self.label = model, data, s, device, teacher, label
        (self.on_batch, self.after_backward), self.checkpoint, self.student_size = hooks, checkpoint, student_size
        self.world = distributed.world()
        self.memory = torch.channels_last if s.channels_last else torch.contiguous_format
        model.to(device, memory_format=self.memory)
        if teacher is not None:
            teacher.to(device, memory_format=self.memory).eval()
        self.loader = train_batches(data, s, device, seed, distributed.rank(), self.world, checkpoint is not None)
        self.resumed = ckpt.load(checkpoint, model, label)
        self.weights, self.val_loader = data.train_weights, data.val_loader()
        self.result = FitResult(accuracy=0.0, processes=self.world, data_path=data_path(self.loader))
        self.start = time.perf_counter()
        if s.whiten and self.resumed is None:  # a resumed model has its whitened stem already
            whiten_first_conv(model, whitening_sample(data).to(device))
        net = model
        if self.world > 1:
            net = nn.parallel.DistributedDataParallel(
                model, device_ids=[device.index or 0] if device.type == "cuda" else None
            )
        self.opt = make_optimizer(model, s)
        self.still = frozen_modules(model, s.freeze)
        self.distill = distill or LogitDistillSettings()
        self.features = self._feature_distiller()
        self.sched = make_schedule(self.opt, s, len(self.loader))
        self.dtype = autocast_dtype(s, device)
        self.scaler = torch.amp.GradScaler(device.type, enabled=self.dtype == torch.float16)
        self.ema = None
        if s.ema:
            from timm.utils import ModelEmaV3

            # Decay warm-up (1 - (1 + step)^-2/3, capped at ema_decay): a short run is not averaged
            # with its random initialisation.
            self.ema = ModelEmaV3(model, decay=s.ema_decay, use_warmup=True)
        # one static graph per image size: faster than a dynamic one
        self.step_fn = torch.compile(net, dynamic=False) if s.compile else net
        if s.compile:
            self.result.compile_s = warm_compiled(self.step_fn, model, self.loader, s, self.dtype, device, self.memory)
        self.selective = s.hard_fraction is not None and s.hard_fraction < 1
        self.acc = 0.0

    def _feature_distiller(self):
        if self.teacher is None or getattr(self.distill, "features", None) is None:
            return None
        # the probe batch comes from the unshuffled split: drawing one from the training loader would
        # move the random state the training batches are shuffled with
        sample = next(iter(self.val_loader if len(self.data.val) else self.loader))[0][:2]
        probe = to_device(sample, self.device, self.memory)
        features = FeatureDistiller(self.model, self.teacher, self.distill.features, probe)
        adapters = list(features.adapters.parameters())
        if adapters:  # they learn with the student, at its learning rate; they do not ship
            self.opt.add_param_group({"params": adapters, "weight_decay": 0.0})
        self.result.features = features.record()
        return features

    def resume(self) -> int:
        """The first epoch to train: after those an epoch checkpoint had finished, else 0."""
        if self.resumed is None:
            return 0
        r = self.result
        self.acc, first = restore(
            self.resumed, r, self.model, self.opt, self.sched, self.scaler, self.ema, self.features
        )
        ckpt.restore_rng(self.resumed, self.loader)
        # training seconds go on from the checkpoint's: the epoch cut short, and the pause, count nothing
        self.start = time.perf_counter() - self.resumed["train_s"] - r.eval_s - r.compile_s - r.checkpoint_s
        log(f"  {self.label}: resumed after epoch {first}/{self.s.epochs} from {self.checkpoint.path.name}")
        return first

    def batch_losses(self, inputs: torch.Tensor, targets: torch.Tensor, grad: bool = True):
        """(logits, per-sample loss): cross-entropy, or distillation from the teacher at its own size."""
        s = self.s
        with torch.set_grad_enabled(grad):
            out = self.step_fn(resize(inputs, self.student_size, self.memory))
            if self.teacher is None:
                return out, F.cross_entropy(out, targets, label_smoothing=s.label_smoothing, reduction="none")
            with torch.no_grad():
                t_out = self.teacher(inputs)
            d = self.distill
            loss = distill_loss(out.float(), t_out.float(), targets, d.temperature, d.alpha, s.label_smoothing)
            return out, loss if self.features is None else loss + self.features.loss(len(inputs))

    def evaluate(self, net_to_eval: nn.Module) -> float:
        at_size = torch_predictor(net_to_eval, self.device, self.s.channels_last)

        def predict(x: torch.Tensor) -> torch.Tensor:
            return at_size(resize(x, self.student_size, torch.contiguous_format))

        return accuracy(mirror_averaged(predict) if self.s.tta_flip else predict, self.val_loader)

    def train_seconds(self) -> float:
        r = self.result
        return time.perf_counter() - self.start - r.eval_s - r.compile_s - r.checkpoint_s

    def train_epoch(self, epoch: int, bar, task) -> tuple[float, int, int, int | None]:
        """One epoch's steps: (loss sum, samples, steps, the epoch's image size)."""
        s, device, memory = self.s, self.device, self.memory
        self.model.train()
        for module in self.still:  # frozen layers: their batch norm keeps the pretrained statistics
            module.eval()
        set_epoch(self.loader, epoch)
        size = epoch_size(s, epoch)
        loss_sum, seen, steps = 0.0, 0, 0
        for x, y, idx in self.loader:
            x = resize(to_device(x, device, memory), size, memory)
            y = y.to(device, non_blocking=True)
            w = None if self.weights is None else self.weights[idx].to(device)
            loss = self._step(x, y, idx, w)
            loss_sum += loss.item() * len(y)
            seen += len(y)
            self.result.samples += len(y)
            steps += 1
            if bar:
                bar.update(task, advance=1, info=f"epoch {epoch + 1}/{s.epochs} loss {loss_sum / seen:.3f}")
            # One process decides on a time limit mid-epoch; several decide together after it.
            if self.world == 1 and s.max_train_s and self.train_seconds() >= s.max_train_s:
                self.result.stopped = "time limit"
                break
        return loss_sum, seen, steps, size

    def _step(self, x, y, idx, w) -> torch.Tensor:
        """One optimiser step on a batch (its hardest fraction under selective backprop); the loss."""
        s, opt, scaler = self.s, self.opt, self.scaler
        with torch.autocast(self.device.type, dtype=self.dtype or torch.float32, enabled=self.dtype is not None):
            out, per_sample = self.batch_losses(x, y, grad=not self.selective)
            if self.on_batch is not None:
                self.on_batch(idx, out.detach(), y)
            if self.selective:
                keep = hardest(per_sample.float() * (1 if w is None else w), s.hard_fraction)
                x, y, w = x[keep], y[keep], None if w is None else w[keep]
                out, per_sample = self.batch_losses(x, y)
            loss = per_sample.mean() if w is None else (per_sample * w).sum() / w.sum()
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        if s.grad_clip or self.after_backward is not None:
            scaler.unscale_(opt)
        if self.after_backward is not None:
            self.after_backward()
        if s.grad_clip:
            nn.utils.clip_grad_norm_(self.model.parameters(), s.grad_clip)
        scaler.step(opt)
        scaler.update()
        self.sched.step()
        if self.ema is not None:
            self.ema.update(self.model, step=self.sched.last_epoch)
        return loss

    def end_epoch(self, epoch: int, loss_sum: float, seen: int, steps: int, size: int | None) -> bool:
        """Evaluate, record and checkpoint after an epoch; whether training stops here."""
        s, result = self.s, self.result
        synchronize(self.device)
        t_eval = time.perf_counter()
        self.acc = acc = self.evaluate(self.ema.module if self.ema else self.model)
        result.eval_s += time.perf_counter() - t_eval
        train_s = self.train_seconds()
        done = epoch + steps / max(1, len(self.loader))
        result.history.append(
            {
                "epoch": round(done, 3),
                "loss": loss_sum / max(seen, 1),
                "val_accuracy": acc,
                "train_s": round(train_s, 3),
                "lr": self.opt.param_groups[0]["lr"],
                **({"size": size} if size else {}),
            }
        )
        log(
            f"  {self.label} epoch {epoch + 1:>3}/{s.epochs}  loss {loss_sum / max(seen, 1):.4f}  val top-1 {acc:.4f}"
            f"{' (mirror-averaged)' if s.tta_flip else ''}  ({train_s:.1f}s)"
        )
        if s.target_accuracy is not None and result.time_to_accuracy_s is None and acc >= s.target_accuracy:
            result.time_to_accuracy_s, result.epochs_to_accuracy = round(train_s, 3), round(done, 3)
            if s.stop_at_target:
                result.stopped = "target"
        # Past the limit at an epoch's end (its last steps, or the time around them): no new epoch
        # is begun. Several processes decide together.
        if s.max_train_s and epoch + 1 < s.epochs and distributed.broadcast_flag(train_s >= s.max_train_s):
            result.stopped = result.stopped or "time limit"
        last = epoch + 1 == s.epochs or bool(result.stopped)
        if self.checkpoint is not None and self.checkpoint.due(epoch + 1, last=last):
            state = snapshot(result, self.model, self.opt, self.sched, self.scaler, self.ema, self.features)
            state.update(label=self.label, epoch=epoch + 1, epochs=s.epochs, accuracy=acc, train_s=self.train_seconds())
            result.checkpoint_s += ckpt.save(self.checkpoint, state, self.loader)
        return bool(result.stopped)

    def finish(self) -> FitResult:
        """The trained model as it ships (the EMA's weights, where kept) and the result."""
        model, result, s = self.model, self.result, self.s
        if self.ema is not None:
            model.load_state_dict(self.ema.module.state_dict())
        result.wall_s = time.perf_counter() - self.start
        result.train_s = result.wall_s - result.eval_s - result.compile_s
        acc = self.evaluate(model) if s.epochs == 0 else self.acc
        result.accuracy = acc
        if s.tta_flip:  # what ships is the model alone: its own accuracy is the stage's
            result.accuracy_tta = acc
            result.accuracy = accuracy(torch_predictor(model, self.device, s.channels_last), self.val_loader)
        if self.world > 1:
            result.max_param_difference = distributed.max_param_difference(model)
        model.to(memory_format=torch.contiguous_format).eval()
        return result


_RESUMED_FIELDS = (
    "history",
    "eval_s",
    "checkpoint_s",
    "samples",
    "time_to_accuracy_s",
    "epochs_to_accuracy",
    "stopped",
)


def snapshot(result: FitResult, model, opt, sched, scaler, ema, features) -> dict:
    """The loop's state at an epoch's end, for an epoch checkpoint (checkpoint.py)."""
    return {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "scheduler": sched.state_dict(),
        "scaler": scaler.state_dict(),
        "ema": ema.state_dict() if ema is not None else None,
        "adapters": features.adapters.state_dict() if features is not None else None,
        "result": {k: getattr(result, k) for k in _RESUMED_FIELDS},
    }


def restore(state: dict, result: FitResult, model, opt, sched, scaler, ema, features) -> tuple[float, int]:
    """Put a snapshot back; the last validation top-1 and the epochs it had finished."""
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    sched.load_state_dict(state["scheduler"])
    scaler.load_state_dict(state["scaler"])
    if ema is not None and state["ema"] is not None:
        ema.load_state_dict(state["ema"])
    if features is not None and state["adapters"] is not None:
        features.adapters.load_state_dict(state["adapters"])
    for k, v in state["result"].items():
        setattr(result, k, v)
    result.resumed_from_epoch = state["epoch"]
    return state["accuracy"], state["epoch"]

"""The one training loop: classification, or distillation from a teacher, for every modality.

Time-to-accuracy (DAWNBench's metric) is the training wall-clock, evaluation passes excluded
(airbench's convention), until validation top-1 first reaches the target.
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..device import synchronize
from ..errors import EffvisionError
from ..progress import log, progress_bar
from ..scoring import accuracy, torch_predictor
from . import checkpoint as ckpt
from . import distributed
from .checkpoint import EpochCheckpoint
from .config import LogitDistillSettings, TrainSettings
from .features import FeatureDistiller
from .whiten import whiten_first_conv

_TIMM_OPT = {
    "sgd": "sgd",
    "nesterov": "nesterov",
    "momentum": "momentum",
    "adamw": "adamw",
    "lamb": "lamb",
    "lars": "lars",
}


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
    torch.manual_seed(seed)
    check_tricks(s, data)
    rank, world = distributed.rank(), distributed.world()
    memory = torch.channels_last if s.channels_last else torch.contiguous_format
    model.to(device, memory_format=memory)
    if teacher is not None:
        teacher.to(device, memory_format=memory).eval()
    loader = train_batches(data, s, device, seed, rank, world, resumable=checkpoint is not None)
    resumed = ckpt.load(checkpoint, model, label)
    weights = data.train_weights
    val_loader = data.val_loader()
    result = FitResult(accuracy=0.0, processes=world, data_path=data_path(loader))
    start = time.perf_counter()
    if s.whiten and resumed is None:  # a resumed model has its whitened stem already
        whiten_first_conv(model, whitening_sample(data).to(device))
    net = model
    if world > 1:
        net = nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index or 0] if device.type == "cuda" else None
        )
    opt = make_optimizer(model, s)
    still = frozen_modules(model, s.freeze)
    distill = distill or LogitDistillSettings()
    features = None
    if teacher is not None and getattr(distill, "features", None) is not None:
        # the probe batch comes from the unshuffled split: drawing one from the training loader would
        # move the random state the training batches are shuffled with
        sample = next(iter(val_loader if len(data.val) else loader))[0][:2]
        features = FeatureDistiller(model, teacher, distill.features, to_device(sample, device, memory))
        adapters = list(features.adapters.parameters())
        if adapters:  # they learn with the student, at its learning rate; they do not ship
            opt.add_param_group({"params": adapters, "weight_decay": 0.0})
        result.features = features.record()
    sched = make_schedule(opt, s, len(loader))
    dtype = autocast_dtype(s, device)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    ema = None
    if s.ema:
        from timm.utils import ModelEmaV3

        # Decay warm-up (1 - (1 + step)^-2/3, capped at ema_decay): a short run is not averaged
        # with its random initialisation.
        ema = ModelEmaV3(model, decay=s.ema_decay, use_warmup=True)
    step_fn = (
        torch.compile(net, dynamic=False) if s.compile else net
    )  # one static graph per image size: faster than a dynamic one
    if s.compile:
        result.compile_s = warm_compiled(step_fn, model, loader, s, dtype, device, memory)
    selective = s.hard_fraction is not None and s.hard_fraction < 1

    def batch_losses(
        inputs: torch.Tensor, targets: torch.Tensor, grad: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.set_grad_enabled(grad):
            out = step_fn(resize(inputs, student_size, memory))
            if teacher is None:
                return out, F.cross_entropy(out, targets, label_smoothing=s.label_smoothing, reduction="none")
            with torch.no_grad():
                t_out = teacher(inputs)
            loss = distill_loss(
                out.float(), t_out.float(), targets, distill.temperature, distill.alpha, s.label_smoothing
            )
            return out, loss if features is None else loss + features.loss(len(inputs))

    def evaluate(net_to_eval: nn.Module) -> float:
        at_size = torch_predictor(net_to_eval, device, s.channels_last)

        def predict(x: torch.Tensor) -> torch.Tensor:
            return at_size(resize(x, student_size, torch.contiguous_format))

        return accuracy(mirror_averaged(predict) if s.tta_flip else predict, val_loader)

    def train_seconds() -> float:
        return time.perf_counter() - start - result.eval_s - result.compile_s - result.checkpoint_s

    acc, first_epoch = 0.0, 0
    if resumed is not None:
        acc, first_epoch = restore(resumed, result, model, opt, sched, scaler, ema, features)
        ckpt.restore_rng(resumed, loader)
        # training seconds go on from the checkpoint's: the epoch cut short, and the pause, count nothing
        start = time.perf_counter() - resumed["train_s"] - result.eval_s - result.compile_s - result.checkpoint_s
        log(f"  {label}: resumed after epoch {first_epoch}/{s.epochs} from {checkpoint.path.name}")
    last_epoch = first_epoch if result.stopped else s.epochs
    # the feature hooks come off the student and teacher however the loop ends (an interrupt, an error)
    hooks = contextlib.closing(features) if features is not None else contextlib.nullcontext()
    with progress_bar() as bar, hooks:
        total, done_steps = s.epochs * len(loader), first_epoch * len(loader)
        task = bar.add_task(label, total=total, completed=done_steps, info="") if bar else None
        for epoch in range(first_epoch, last_epoch):
            model.train()
            for module in still:  # frozen layers: their batch norm keeps the pretrained statistics
                module.eval()
            set_epoch(loader, epoch)
            size = epoch_size(s, epoch)
            loss_sum, seen, steps = 0.0, 0, 0
            for x, y, idx in loader:
                x = resize(to_device(x, device, memory), size, memory)
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
                if s.grad_clip or after_backward is not None:
                    scaler.unscale_(opt)
                if after_backward is not None:
                    after_backward()
                if s.grad_clip:
                    nn.utils.clip_grad_norm_(model.parameters(), s.grad_clip)
                scaler.step(opt)
                scaler.update()
                sched.step()
                if ema is not None:
                    ema.update(model, step=sched.last_epoch)
                loss_sum += loss.item() * len(y)
                seen += len(y)
                result.samples += len(y)
                steps += 1
                if bar:
                    bar.update(task, advance=1, info=f"epoch {epoch + 1}/{s.epochs} loss {loss_sum / seen:.3f}")
                # One process decides on a time limit mid-epoch; several decide together after it.
                if world == 1 and s.max_train_s and train_seconds() >= s.max_train_s:
                    result.stopped = "time limit"
                    break
            synchronize(device)
            t_eval = time.perf_counter()
            acc = evaluate(ema.module if ema else model)
            result.eval_s += time.perf_counter() - t_eval
            train_s = train_seconds()
            done = epoch + steps / max(1, len(loader))
            result.history.append(
                {
                    "epoch": round(done, 3),
                    "loss": loss_sum / max(seen, 1),
                    "val_accuracy": acc,
                    "train_s": round(train_s, 3),
                    "lr": opt.param_groups[0]["lr"],
                    **({"size": size} if size else {}),
                }
            )
            log(
                f"  {label} epoch {epoch + 1:>3}/{s.epochs}  loss {loss_sum / max(seen, 1):.4f}  val top-1 {acc:.4f}"
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
            if checkpoint is not None and checkpoint.due(epoch + 1, last=epoch + 1 == s.epochs or bool(result.stopped)):
                state = snapshot(result, model, opt, sched, scaler, ema, features)
                state.update(label=label, epoch=epoch + 1, epochs=s.epochs, accuracy=acc, train_s=train_seconds())
                result.checkpoint_s += ckpt.save(checkpoint, state, loader)
            if result.stopped:
                break
    if ema is not None:
        model.load_state_dict(ema.module.state_dict())
    result.wall_s = time.perf_counter() - start
    result.train_s = result.wall_s - result.eval_s - result.compile_s
    if s.epochs == 0:
        acc = evaluate(model)
    result.accuracy = acc
    if s.tta_flip:  # what ships is the model alone: its own accuracy is the stage's
        result.accuracy_tta = acc
        result.accuracy = accuracy(torch_predictor(model, device, s.channels_last), val_loader)
    if world > 1:
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

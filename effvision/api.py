"""effvision.compress: the whole pipeline on the caller's own nn.Module and Dataset/DataLoader —
the stage runner, run folder, resume, report and artifacts of `effvision compress`, with the
model and data given by the call instead of named in a recipe.

    import effvision
    from effvision.stages import Prune, Distill, Export, Quantize, Bench
    result = effvision.compress(net, train=train_ds, val=val_ds,
                                stages=[Prune(ratio=0.5), Distill(epochs=3), Export(), Quantize(), Bench()],
                                run_dir="runs/mine")
    print(result.table(), result.shipped)

Checked before long work: the data's samples and labels, the model's output for a batch of
them, and (with a prune stage) that the pruner can trace the model."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import torch
from torch import nn

from .errors import EffvisionError
from .fileio import read_json


@dataclass
class CompressResult:
    """What a compress call measured: its report (rows, reference comparison, headline), the
    file that ships and the run folder."""

    run_dir: Path
    report: dict = field(repr=False)
    shipped: Optional[Path]
    started_afresh: Optional[str]  # why an earlier run in run_dir was set aside (None: resumed or new)

    @property
    def rows(self) -> list[dict]:
        return self.report["stages"]

    @property
    def reference(self) -> Optional[dict]:
        return self.report.get("reference")

    @property
    def headline(self) -> Optional[dict]:
        return self.report.get("headline")

    def table(self) -> str:
        return (self.run_dir / "report.md").read_text()


def compress(
    model: nn.Module,
    train: Any,
    val: Any,
    *,
    stages: Optional[Sequence[Any]] = None,
    recipe: Optional[str | Path] = None,
    target: Optional[dict | Any] = None,
    run_dir: Optional[str | Path] = None,
    classes: Optional[list[str]] = None,
    batch_size: Optional[int] = None,
    seed: int = 0,
    device: str = "auto",
    name: str = "compress",
) -> CompressResult:
    """Compress the caller's classifier `model` (any nn.Module giving logits) trained on `train`
    and measured on `val` ((input, label) Datasets or DataLoaders, inputs as the model takes them).

    stages: typed stage configs (effvision.stages.Prune(ratio=0.5), ...) or their dicts; or
    recipe: a recipe file whose stages (and seed, device, target) are used, its model and data
    replaced by the call's. target: {"speedup": 2.0, ...} as a recipe's target. A second call into
    the same run_dir resumes; with another model (architecture or weights) or other data it starts
    afresh, and result.started_afresh says why."""
    from .data.caller import caller_data
    from .models import build
    from .models.caller import adopt
    from .pipeline import CallerInputs, run_pipeline
    from .run_data import recipe_decides
    from .stages import validate_recipe

    if not isinstance(model, nn.Module):
        raise EffvisionError(f"model: an nn.Module is expected, got {type(model).__name__}")
    if (stages is None) == (recipe is None):
        raise EffvisionError("give either stages=[...] or recipe=<file>")
    raw = _recipe_raw(recipe, stages, target, seed, device, name)
    data = caller_data(train, val, {**raw["data"], **({"batch_size": batch_size} if batch_size else {})}, classes)
    raw["data"] = data.config.model_dump(mode="json", exclude_defaults=True)
    spec, identity = adopt(model, data.num_classes, data.input_size)
    _check_output(build(spec), data)
    raw["model"] = {"name": spec["name"]}
    typed = validate_recipe(raw, str(recipe) if recipe else "<effvision.compress>")
    typed._source = str(recipe) if recipe else None
    data = data.with_decision_split(recipe_decides(typed))
    if any(s.type == "prune" for s in typed.stages):
        _check_prunable(build(spec), data)
    run_dir = Path(run_dir or Path("runs") / typed.name)
    before = _init_fingerprint(run_dir)
    report = run_pipeline(typed, run_dir, inputs=CallerInputs(spec, data, {"model": identity, "data": data.identity}))
    return _result(run_dir, report, before)


def _recipe_raw(recipe, stages, target, seed, device, name) -> dict:
    """The recipe as a mapping, without model (the call's) and with only the data keys that
    apply to the caller's data (batch sizes)."""
    if recipe is not None:
        from .recipe import read_yaml

        raw = read_yaml(Path(recipe)) or {}
        if not isinstance(raw, dict):
            raise EffvisionError(f"{recipe}: a recipe must be a YAML mapping")
        raw.pop("model", None)
        raw.pop("presets", None)
        given = raw.pop("data", None) or {}
        raw["data"] = {k: v for k, v in given.items() if k in ("batch_size", "eval_batch_size")}
    else:
        raw = {"name": name, "seed": seed, "device": device, "stages": [_stage_dict(s) for s in stages], "data": {}}
    if target is not None:
        raw["target"] = target.model_dump(mode="json", exclude_unset=True) if hasattr(target, "model_dump") else target
    return raw


def _stage_dict(stage: Any) -> dict:
    """A typed stage config (or its dict) as a recipe's stage entry."""
    if isinstance(stage, dict):
        return dict(stage)
    if hasattr(stage, "model_dump"):
        return {"type": stage.type, **stage.model_dump(mode="json", exclude_unset=True)}
    raise EffvisionError(f"stages: {stage!r} is neither a stage config (effvision.stages.Prune(...)) nor a dict")


def _sample_batch(data, n: int = 2) -> torch.Tensor:
    return torch.stack([data.train[i][0] for i in range(min(n, len(data.train)))]).float()


def _check_output(probe: nn.Module, data) -> None:
    """The model (a copy) takes the data's inputs and gives one logit per class."""
    x = _sample_batch(data)
    probe.eval()
    try:
        with torch.no_grad():
            out = probe(x)
    except Exception as exc:  # noqa: BLE001  (any failure here is the caller's model or data)
        raise EffvisionError(
            f"the model fails on a batch of the train data (inputs {tuple(x.shape)}): "
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        ) from None
    want = (x.shape[0], data.num_classes)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != want:
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise EffvisionError(
            f"the model gives {got} for a batch of inputs {tuple(x.shape)}; logits of shape {want} are expected "
            f"({data.num_classes} classes in the labels)"
        )


def _check_prunable(model: nn.Module, data) -> None:
    """A prune stage will trace the model: try it on a copy now rather than after training."""
    name = model.effvision_spec["class"].split(".")[-1]
    from .compression.prune import prune

    trial = model  # a copy
    try:
        prune(trial, 0.1)
        with torch.no_grad():
            trial.eval()(_sample_batch(data))
    except EffvisionError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise EffvisionError(
            f"the pruner cannot trace {name}: {type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''} (leave out the prune stage, or name the layers "
            "it cannot follow in its ignore: list)"
        ) from None


def _init_fingerprint(run_dir: Path) -> Optional[str]:
    init = run_dir / "stages" / "0-init" / "metrics.json"
    return read_json(init).get("fingerprint") if init.is_file() else None


def _result(run_dir: Path, report: dict, before: Optional[str]) -> CompressResult:
    from .runtimes import shipped_artifact, shipped_record

    records = [read_json(run_dir / "stages" / r["stage_dir"] / "metrics.json") for r in report["stages"]]
    shipped = (shipped_artifact(shipped_record(records)["artifacts"]) or (None, None))[1]
    init = read_json(run_dir / "stages" / "0-init" / "metrics.json")
    return CompressResult(
        run_dir=run_dir,
        report=report,
        shipped=run_dir / shipped if shipped else None,
        started_afresh=init.get("started_afresh") if before and before != init["fingerprint"] else None,
    )

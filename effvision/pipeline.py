"""The stage runner: one stage after another into a run folder, resuming after the last
completed stage. A stage is complete once its metrics.json exists (written last, atomically) and
every artifact it names is there; the report is written after the last stage, so a run folder
with a report.json holds a finished run. One process writes a run folder at a time (runlock).

Inside a stage that trains, epoch checkpoints (train/checkpoint.py) live in the stage folder's
resume/: a stage cut short keeps them for its next attempt, with the same inputs, and drops them
once complete. A stop signal ends the run with one line saying what was kept (RunInterrupted)."""

from __future__ import annotations

import copy
import hashlib
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch

from . import stages as _stages  # noqa: F401  (registers every stage type before a run)
from . import yamlio
from .device import resolve_device
from .errors import EffvisionError
from .fileio import WriteFailed, read_json, write_json, write_text
from .interrupts import Interrupted
from .progress import log
from .recipe import Recipe, recipe_to_dict
from .registry import STAGES
from .runlock import private_run_dir, run_lock
from .stage import StageResult
from .train.checkpoint import RESUME_DIR

INIT_DIR = "0-init"
RESUME_MARK = "stage.json"  # in a stage's resume/ folder: the fingerprint its checkpoints were taken under


class RunInterrupted(Interrupted):
    """A stop signal ended a pipeline run; reason says what the run folder kept."""


def _hash(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def recipe_data(recipe: Recipe, size: int | None = None):
    """The recipe's dataset, fed the way its model's weights expect: a pretrained card's mean, std
    and interpolation (its `preprocessing`) replace the dataset card's; `size`: images at that
    side instead (an input size a plan stage kept)."""
    from .data import load_dataset
    from .models.zoo import get_card

    card = get_card(recipe.model.name)
    config = recipe.data if size is None else recipe.data.model_copy(update={"image_size": size})
    return load_dataset(config, seed=recipe.seed, preprocessing=card.preprocessing if card else None)


@dataclass
class CallerInputs:
    """A model and data the caller holds (effvision.compress), in place of the recipe's names."""

    spec: dict  # what build() makes the caller's model from (models/caller.py)
    data: Any  # a CallerBundle (data/caller.py)
    identity: dict  # {"model": architecture and weights hashes, "data": sizes and items hash}


class RunContext:
    """What stages share: the data, the current model/ONNX artifact, earlier stages' records."""

    def __init__(self, recipe: Recipe, run_dir: Path, inputs: Optional[CallerInputs] = None):
        self.recipe, self.run_dir, self.inputs = recipe, run_dir, inputs
        self.device = resolve_device(recipe.device)
        self.seed = recipe.seed
        self.records: list[dict] = []
        self.model_path: Optional[Path] = None
        self.onnx: Optional[Path] = None
        self.exported: Optional[Path] = None  # the latest exported file of any runtime (an ONNX file, IR, .tflite)
        self.stage_dir: Path = run_dir
        self.notes: dict = {}  # what the running stage's helpers record beside its result (joins its record)
        self._model: Optional[torch.nn.Module] = None
        self._data = None
        self._size: Optional[int] = None  # the lower input size a plan stage kept (None: the data's own)
        self._full = None  # the data at its own size, where a plan stage kept a lower one
        self._selection: Optional[tuple[list[int], Optional[list[float]]]] = (
            None  # a select stage's coreset of the training split
        )
        self._selected = None

    # -- shared inputs -------------------------------------------------------------------
    @property
    def data(self):
        """The recipe's dataset; after a select stage, its training split is the kept coreset."""
        if self._data is None:
            self._data = self.inputs.data if self.inputs else recipe_data(self.recipe, self._size)
            summary = self._data.summary()
            if summary["bad_samples"]:
                log(
                    f"[yellow]skipped {summary['bad_samples']} unreadable files[/] (first: "
                    f"{self._data.bad_samples[0][0]})"
                )
            write_json(
                self.run_dir / "dataset.json", {**summary, "bad_files": [p for p, _ in self._data.bad_samples[:100]]}
            )
        if self._selection is None:
            return self._data
        if self._selected is None:
            self._selected = self._data.with_train_subset(*self._selection)
        return self._selected

    @property
    def full_data(self):
        """The data at its own input size (what the uncompressed reference and a distillation's
        teacher see), the training split as `data` has it; `data` itself where no lower size was kept."""
        if self._size is None:
            return self.data
        if self._full is None:
            self._full = recipe_data(self.recipe)
        return self._full if self._selection is None else self._full.with_train_subset(*self._selection)

    @property
    def student_size(self) -> Optional[int]:
        """The input size the model being compressed takes, where a plan stage lowered it."""
        return self._size

    @property
    def full_input_shape(self) -> list[int]:
        return self.full_data.input_size

    def use_size(self, size: Optional[int]) -> None:
        """Later stages train, evaluate and export the model at this input size (a plan's lever)."""
        if size != self._size:
            self._size, self._data, self._selected = size, None, None

    def select_train(self, indices, weights=None) -> Path:
        """Train later stages on these samples of the current training split; saved as selection.json."""
        current = self._selection[0] if self._selection else range(len(self.data.train))
        full = [int(current[i]) for i in indices]  # indices into the whole training split
        w = None if weights is None else [round(float(v), 6) for v in weights]
        path = write_text(self.stage_dir / "selection.json", json.dumps({"indices": full, "weights": w}))
        self._selection, self._selected = (full, w), None
        return path

    def calibration_loader(self, cfg):
        """The int8 calibration samples a CalibrationConfig asks for, scored by the current model."""
        from .compression.selection import calibration_indices

        return self.data.train_eval_loader(
            calibration_indices(self.data, cfg, self.model, self.device, self.seed), batch_size=32
        )

    @property
    def input_shape(self) -> list[int]:
        return self.data.input_size

    @property
    def model(self) -> torch.nn.Module:
        if self._model is None:
            from .models import load_checkpoint

            self._model = load_checkpoint(self.model_path)
        return self._model

    def initial_model(self) -> torch.nn.Module:
        from .models import build, create_model

        m, d = self.recipe.model, self.recipe.data
        model = (
            build(self.inputs.spec)
            if self.inputs
            else create_model(
                m.name,
                num_classes=self.data.num_classes,
                pretrained=m.pretrained,
                input_size=self.data.input_size,
                **m.kwargs,
            )
        )
        # Saved with every checkpoint, so `effvision export` calibrates on the data the model knows.
        model.effvision_spec["data"] = {"name": d.name, "root": d.root, "image_size": d.image_size}
        return model

    def epoch_checkpoint(self, label: str, every: int):
        """Where this stage's training call `label` keeps its epoch checkpoints (None: every is 0)."""
        from .train.checkpoint import for_stage

        return for_stage(self.stage_dir, label, every)

    def rel(self, path: Path) -> str:
        return str(Path(path).relative_to(self.run_dir))

    # -- results -------------------------------------------------------------------------
    def _measure(self, model: torch.nn.Module) -> dict:
        from .models import count_macs, count_params

        shape = self.input_shape
        return {"params": count_params(model), "macs": count_macs(model, shape), "input_size": list(shape)}

    def torch_result(
        self,
        model: torch.nn.Module,
        accuracy: float | None = None,
        time_to_accuracy_s: float | None = None,
        extra: dict | None = None,
    ) -> StageResult:
        """Save the stage's torch model, measure it, and make it the current model."""
        from .models import save_checkpoint
        from .scoring import accuracy as top1
        from .scoring import torch_predictor

        model = model.eval()
        if accuracy is None:
            accuracy = top1(torch_predictor(model, self.device), self.data.val_loader())
        path = save_checkpoint(model, self.stage_dir / "model.pt", metadata=self.describe(model, accuracy))
        self._model, self.model_path = model, path
        metrics = {
            **self._measure(model),
            "size_bytes": path.stat().st_size,
            "accuracy": accuracy,
            "evaluated_with": "torch",
            "time_to_accuracy_s": time_to_accuracy_s,
            **(extra or {}),
        }
        return StageResult(metrics, {"model": path.name})

    def describe(self, model: torch.nn.Module, accuracy: float, path: Path | None = None, **source) -> dict:
        """What an artifact of this stage carries (deploy/metadata.py): classes, preprocessing,
        input, the accuracy just measured on the whole validation split, recipe and stage."""
        from .deploy.metadata import for_artifact

        source = {"recipe": self.recipe.name, "stage": self.stage_dir.name, **source}
        return for_artifact(self.data, model, accuracy, path, source)

    def artifact_result(self, path: Path, extra: dict | None = None) -> StageResult:
        """Measure an exported artifact by running it in its runtime (deploy/runtimes.py); an ONNX
        file becomes the current artifact for later stages."""
        from .deploy import evaluate
        from .deploy.metadata import write_metadata
        from .deploy.runtimes import runtime_of_path

        path = Path(path)
        files = runtime_of_path(path)
        kind, runtime = files.kind, files.name
        acc = evaluate(path, self.data.val_loader())
        write_metadata(path, self.describe(self.model, acc, path, precision=(extra or {}).get("precision", "fp32")))
        if kind == "onnx":
            self.onnx = path
        self.exported = path
        metrics = {
            **self._measure(self.model),
            "size_bytes": files.file_bytes(path),
            "accuracy": acc,
            "evaluated_with": runtime,
            "time_to_accuracy_s": None,
            **(extra or {}),
        }
        return StageResult(metrics, {kind: path.name})

    def shipped_record(self) -> dict:
        from .deploy.runtimes import shipped_record

        return shipped_record(self.records)

    def bench_result(self, measurements: list[dict], extra: dict | None = None) -> StageResult:
        """The bench row describes the artifact that ships (the last exported file, else the last model)."""
        final = self.shipped_record()
        keep = ("params", "macs", "size_bytes", "accuracy", "evaluated_with")
        metrics = {k: final.get(k) for k in keep}
        metrics.update(artifact_of=final["name"], time_to_accuracy_s=None, measurements=measurements, **(extra or {}))
        return StageResult(metrics, {})

    @property
    def records_by_name(self) -> dict[str, dict]:
        return {r["name"]: r for r in self.records}

    def artifacts_to_bench(self, targets: str):
        """(stage name, kind, artifact) for every stage artifact, or only the last of each kind."""
        from .deploy.runtimes import artifact_kinds
        from .models import load_checkpoint

        items = [
            (r["name"], kind, self.run_dir / path)
            for r in self.records
            for kind, path in r["artifacts"].items()
            if kind in artifact_kinds()
        ]
        if targets == "final":
            items = list({kind: (name, kind, path) for name, kind, path in items}.values())  # the last of each kind
        for name, kind, path in items:
            yield name, kind, (load_checkpoint(path) if kind == "model" else path)

    def resolve_teacher(self, spec: str | None):
        """The distillation teacher: auto = the model that entered the most recent prune stage,
        input = a copy of the model entering this stage (qat's float model)."""
        from .models import load_checkpoint

        if spec in (None, "none", "null"):
            return None, None
        if spec == "input":
            return copy.deepcopy(self.model).to(self.device).eval(), "input"
        if spec == "auto":
            pruned = [r for r in self.records if r["type"] == "prune"]
            if not pruned:
                log("  no prune stage before distill: plain fine-tuning")
                return None, None
            path = pruned[-1]["input_model"]
        elif spec in {r["name"] for r in self.records}:
            rec = next(r for r in self.records if r["name"] == spec)
            if "model" not in rec["artifacts"]:
                raise EffvisionError(f"teacher stage '{spec}' produced no torch model")
            path = rec["artifacts"]["model"]
        elif Path(spec).is_file():
            return load_checkpoint(spec).to(self.device), spec
        else:
            names = [r["name"] for r in self.records if "model" in r["artifacts"]]
            raise EffvisionError(
                f"teacher '{spec}' is neither 'auto', 'input', 'none', an earlier stage ({', '.join(names)}) "
                "nor a checkpoint file"
            )
        return load_checkpoint(self.run_dir / path).to(self.device), path

    def adopt(self, record: dict) -> None:
        """Take over a completed stage's outputs (on resume) without re-running it."""
        from .deploy.runtimes import shipped_artifact

        arts = record["artifacts"]
        if "model" in arts:
            self.model_path, self._model = self.run_dir / arts["model"], None
        if "onnx" in arts:
            self.onnx = self.run_dir / arts["onnx"]
        exported = shipped_artifact({k: v for k, v in arts.items() if k != "model"})
        if exported is not None:
            self.exported = self.run_dir / exported[1]
        if "selection" in arts:
            saved = read_json(self.run_dir / arts["selection"])
            self._selection, self._selected = (saved["indices"], saved["weights"]), None
        plan = record.get("plan")
        if plan is not None:  # a lower input size the plan kept: every later stage works at it
            size = plan["kept"]["size"]
            self.use_size(size if size < plan["reference"]["size"] else None)
        self.records.append(record)


def run_pipeline(
    recipe: Recipe,
    run_dir: str | Path | None = None,
    only_types: set[str] | None = None,
    inputs: Optional[CallerInputs] = None,
) -> dict:
    """Run (or resume) a recipe into run_dir (default runs/<recipe.name>); returns report.json.
    In a multi-process (torchrun) job every process runs the stages; rank 0 alone writes run_dir.
    inputs: the caller's model and data in place of the recipe's (effvision.compress)."""
    from .compression.aim import check_target

    _check_names(recipe, inputs)  # an unknown name first, before the run folder is touched
    device = resolve_device(recipe.device)
    for target in [recipe.target] + [getattr(s, "target", None) for s in recipe.stages]:
        if target is not None and not isinstance(target, bool):
            check_target(target, device)  # before the run folder is touched
    with private_run_dir(Path(run_dir or Path("runs") / recipe.name)) as own_dir, run_lock(own_dir):
        try:
            return _run_stages(recipe, own_dir, only_types, inputs)
        except (KeyboardInterrupt, Interrupted) as stop:
            raise _interrupted(stop, own_dir) from None
        except WriteFailed as exc:  # a full or failing disk: the file, and what the run folder kept
            why = f"{exc.reason}; {own_dir} keeps {_kept(own_dir)}; free space and run the same command to continue"
            raise WriteFailed(exc.path, why) from None


def _check_names(recipe: Recipe, inputs: Optional[CallerInputs]) -> None:
    """The recipe's model and dataset names exist (else one line: unknown, did you mean), unless the
    caller brought its own model and data."""
    from .data.cards import get_card
    from .models import resolve

    if inputs is None:
        resolve(recipe.model.name)
        get_card(recipe.data.name)


def _interrupted(stop: BaseException, run_dir: Path) -> RunInterrupted:
    """What a stopped run kept: its completed stages and the last epoch checkpoint of the stage it was in."""
    if isinstance(stop, Interrupted):
        why, code = stop.reason, stop.exit_code
    else:  # SIGINT under Python's own handler
        why, code = "interrupted by SIGINT", 130
    return RunInterrupted(f"{why}; {run_dir} keeps {_kept(run_dir)}", code)


def _kept(run_dir: Path) -> str:
    """The completed stages of a run folder and the last epoch checkpoint written in it."""
    from .train.checkpoint import last_saved

    done = sorted(p.parent.name for p in run_dir.glob("stages/*/metrics.json") if p.parent.name != INIT_DIR)
    kept = f"{len(done)} completed stage{'s' if len(done) != 1 else ''}"
    saved = Path(last_saved["path"]) if last_saved else None
    if saved is not None and saved.is_file() and run_dir.resolve() in saved.resolve().parents:
        kept += f" and {last_saved['label']} at epoch {last_saved['epoch']}/{last_saved['epochs']}"
    return kept


def _aims_at_recipe_target(recipe: Recipe, cfg) -> bool:
    """A stage with a `target` field left unset (or true) reads the recipe's target block, so
    that block is one of its inputs."""
    if recipe.target is None:
        return False
    if getattr(type(cfg), "reads_recipe_target", False):  # a plan's levers, int8's floor
        return True
    return "target" in type(cfg).model_fields and cfg.target in (None, True)


def _forget_unfinished(run_dir: Path) -> None:
    """A killed run leaves temporary files (never renamed into place) and, from an earlier run, a
    report that no longer describes the folder: both go before anything runs."""
    from .report import remove_report

    for tmp in run_dir.rglob(".*.tmp"):
        tmp.unlink(missing_ok=True)
    remove_report(run_dir)


def _completed(sdir: Path, fingerprint: str) -> Optional[dict]:
    """The stage's record when it finished with these inputs and its artifacts are all there."""
    done = sdir / "metrics.json"
    if not done.is_file():
        return None
    record = read_json(done)
    if record.get("fingerprint") != fingerprint:
        return None
    if not all((sdir.parent.parent / path).is_file() for path in record.get("artifacts", {}).values()):
        return None
    return record


def _keep_checkpoints_only(sdir: Path, fingerprint: str, resumable: bool) -> None:
    """Clear an unfinished stage's folder for its next attempt, keeping its epoch checkpoints
    when they were taken with the same inputs (and no stage before it ran again)."""
    resume = sdir / RESUME_DIR
    mark = resume / RESUME_MARK
    keep = resumable and mark.is_file() and read_json(mark).get("fingerprint") == fingerprint
    (sdir / "metrics.json").unlink(missing_ok=True)
    for item in sdir.iterdir():
        if keep and item == resume:
            continue
        shutil.rmtree(item) if item.is_dir() else item.unlink()
    if not keep:
        write_json(mark, {"fingerprint": fingerprint})


def _discard(sdir: Path) -> None:
    """Remove a stage folder, its completion marker first: a removal cut short by a kill must
    not leave a marker beside missing artifacts."""
    (sdir / "metrics.json").unlink(missing_ok=True)
    shutil.rmtree(sdir)


def _run_stages(recipe: Recipe, run_dir: Path, only_types: set[str] | None, inputs: Optional[CallerInputs]) -> dict:
    from .env import collect_env
    from .report import write_report

    run_dir.mkdir(parents=True, exist_ok=True)
    _forget_unfinished(run_dir)
    stages = [s for s in recipe.stages if only_types is None or s.type in only_types]
    resolved = recipe_to_dict(recipe)
    write_text(
        run_dir / "recipe.yaml",
        f"# resolved from {recipe._source or '<api>'}\n" + yamlio.dump(resolved, sort_keys=False),
    )
    write_json(run_dir / "env.json", {**collect_env(), "recipe": recipe._source})
    ctx = RunContext(recipe, run_dir, inputs)
    torch.manual_seed(recipe.seed)

    identity = inputs.identity if inputs else None
    fingerprint = _hash(resolved["data"], resolved["model"], recipe.seed, identity)
    fresh = _prepare_initial_model(ctx, fingerprint)
    planned = {INIT_DIR}
    for k, cfg in enumerate(stages, 1):
        fingerprint = _hash(fingerprint, cfg.model_dump(mode="json"))
        if _aims_at_recipe_target(recipe, cfg):
            fingerprint = _hash(fingerprint, resolved["target"])
        sdir = run_dir / "stages" / f"{k}-{cfg.name}"
        planned.add(sdir.name)
        done = sdir / "metrics.json"
        record = None if fresh else _completed(sdir, fingerprint)
        if record is not None:
            ctx.adopt(record)
            log(f"[dim]stage {k}/{len(stages)} {cfg.name}: completed earlier, resumed[/]")
            continue
        resumable, fresh = not fresh, True  # everything after a re-run stage must re-run too
        sdir.mkdir(parents=True, exist_ok=True)
        _keep_checkpoints_only(sdir, fingerprint, resumable)
        ctx.stage_dir = sdir
        log(f"[bold]stage {k}/{len(stages)} {cfg.name}[/] ({cfg.type})")
        input_model = ctx.rel(ctx.model_path) if ctx.model_path else None
        start = time.perf_counter()
        ctx.notes = {}
        result = STAGES.get(cfg.type).run(ctx, cfg)
        record = {
            "index": k,
            "name": cfg.name,
            "type": cfg.type,
            **ctx.notes,
            **result.metrics,
            "wall_s": round(time.perf_counter() - start, 3),
            "artifacts": {kind: ctx.rel(sdir / f) for kind, f in result.artifacts.items()},
            "input_model": input_model,
            "fingerprint": fingerprint,
        }
        write_json(done, record)
        shutil.rmtree(sdir / RESUME_DIR, ignore_errors=True)  # complete: its epoch checkpoints are spent
        ctx.adopt(record)
    # Stages outside this plan are stale when the recipe dropped them or an earlier stage re-ran;
    # a partial run (`effvision train`) that re-ran nothing leaves the later stages alone.
    if only_types is None or fresh:
        for old in (run_dir / "stages").iterdir():
            if old.is_dir() and old.name not in planned:
                _discard(old)
    _write_bundle(ctx)
    return write_report(run_dir)


def _write_bundle(ctx: RunContext) -> None:
    """runs/<name>/bundle/: the shipped file with its metadata, predict.py and a README, for whoever
    runs it without effvision (deploy/bundle.py); none when what ships has no torch-free runtime."""
    from .deploy.bundle import write_bundle
    from .deploy.metadata import read_metadata
    from .deploy.runtimes import runtime_of_kind, shipped_artifact

    where = ctx.run_dir / "bundle"
    shipped = shipped_artifact(ctx.shipped_record()["artifacts"]) if ctx.records else None
    bundled = shipped is not None and runtime_of_kind(shipped[0]).bundle_package is not None
    if not bundled or read_metadata(ctx.run_dir / shipped[1]) is None:  # (a run folder older than the metadata)
        shutil.rmtree(where, ignore_errors=True)
        return
    write_bundle(ctx.run_dir / shipped[1], where)
    log(f"bundle: {where} (python {where / 'predict.py'} IMAGES...)")


def _prepare_initial_model(ctx: RunContext, fingerprint: str) -> bool:
    """Build (or reuse) the recipe's starting model; True when it had to be built anew."""
    from .models import save_checkpoint

    sdir = ctx.run_dir / "stages" / INIT_DIR
    done = sdir / "metrics.json"
    if _completed(sdir, fingerprint) is not None:
        ctx.model_path = sdir / "model.pt"
        return False
    afresh = None
    if (ctx.run_dir / "stages").exists():
        if done.is_file():
            afresh = f"{_what_changed(read_json(done), ctx)} since this run folder was written: starting it afresh"
            log(f"[yellow]{afresh}[/]")
        done.unlink(missing_ok=True)  # the marker first, as in _discard
        shutil.rmtree(ctx.run_dir / "stages")  # nothing earlier is valid
    model = ctx.initial_model()
    ctx.model_path = save_checkpoint(model, sdir / "model.pt")
    ctx._model = model
    write_json(
        done,
        {
            "fingerprint": fingerprint,
            "model": ctx.recipe.model.name,
            "inputs": ctx.inputs.identity if ctx.inputs else None,
            "started_afresh": afresh,  # why an earlier run in this folder was set aside (None: there was none)
            "artifacts": {"model": ctx.rel(ctx.model_path)},
        },
    )
    return True


def _what_changed(before: dict, ctx: RunContext) -> str:
    """Which of the caller's inputs differ from those a run folder was written with (a recipe's
    data, model or seed when the run has no caller inputs)."""
    old, new = before.get("inputs") or {}, ctx.inputs.identity if ctx.inputs else {}
    if not (old and new):
        return "data, model or seed changed"
    changes = []
    m0, m1 = old.get("model", {}), new["model"]
    if m0.get("architecture") != m1["architecture"]:
        changes.append(f"the model's architecture changed ({m0.get('class')} -> {m1['class']})")
    elif m0.get("weights") != m1["weights"]:
        changes.append(f"the model's weights changed ({m0.get('weights')} -> {m1['weights']})")
    d0, d1 = old.get("data", {}), new["data"]
    if d0 != d1:
        what = [k for k in d1 if d0.get(k) != d1[k]]
        changes.append(f"the data changed ({', '.join(what)})")
    return "; ".join(changes) or "the seed or recipe changed"

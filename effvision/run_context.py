"""What the stages of one run share (RunContext): the recipe's data and its decision split, the
current model and exported file, the records of earlier stages, and how a stage's result is
measured and saved (the pipeline, pipeline.py, runs the stages against it)."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch

from .device import resolve_device
from .errors import EffvisionError
from .fileio import read_json, write_json, write_text
from .progress import log
from .recipe import Recipe
from .run_data import recipe_data
from .stage import StageResult

INIT_DIR = "0-init"


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
    def decisions(self):
        """Where every choice of the run is scored: the decision split (compression/decisions.py)."""
        from .compression.decisions import Decisions

        return Decisions(self)

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
        """Measure an exported artifact by running it in its runtime (effvision/runtimes/); an ONNX
        file becomes the current artifact for later stages."""
        from .deploy import evaluate
        from .deploy.metadata import write_metadata
        from .runtimes import runtime_of_path

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
        from .runtimes import shipped_record

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
        from .models import load_checkpoint
        from .runtimes import artifact_kinds

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
        from .runtimes import shipped_artifact

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

"""The stage runner: one stage after another into a run folder, resuming after the last
completed stage. A stage is complete once its metrics.json exists (written last, atomically) and
every artifact it names is there; the report is written after the last stage, so a run folder
with a report.json holds a finished run. One process writes a run folder at a time (runlock).

Inside a stage that trains, epoch checkpoints (train/checkpoint.py) live in the stage folder's
resume/: a stage cut short keeps them for its next attempt, with the same inputs, and drops them
once complete. A stop signal ends the run with one line saying what was kept (RunInterrupted)."""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path
from typing import Any, Optional

import torch

from . import stages as _stages  # noqa: F401  (registers every stage type before a run)
from . import yamlio
from .device import resolve_device
from .fileio import WriteFailed, read_json, write_json, write_text
from .interrupts import Interrupted
from .progress import log
from .recipe import Recipe, recipe_to_dict
from .registry import STAGES
from .run_context import INIT_DIR, CallerInputs, RunContext
from .run_data import decision_spec
from .runlock import private_run_dir, run_lock
from .train.checkpoint import RESUME_DIR

RESUME_MARK = "stage.json"  # in a stage's resume/ folder: the fingerprint its checkpoints were taken under


class RunInterrupted(Interrupted):
    """A stop signal ended a pipeline run; reason says what the run folder kept."""


def _hash(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


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
    split = decision_spec(recipe) if inputs is None else None  # (the caller's data: its identity says it)
    fingerprint = _hash(resolved["data"], resolved["model"], recipe.seed, identity, *([split] if split else []))
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
    _score_shipped_on_decisions(ctx)
    return write_report(run_dir)


def _score_shipped_on_decisions(ctx: RunContext) -> None:
    """decision.json: the shipped file's top-1 on the decision split, where the run holds one out:
    what a caller choosing among runs (a search) reads, the validation split being the report's."""
    from .deploy.reference import reference_model
    from .runtimes import runtime_of_kind, shipped_artifact

    where = ctx.run_dir / "decision.json"
    where.unlink(missing_ok=True)
    if not ctx.records or ctx.data.decision is None:
        return
    record = ctx.shipped_record()
    kind, path = shipped_artifact(record["artifacts"])
    target = ctx.run_dir / path if kind != "model" else ctx.model
    top1 = ctx.decisions.score_file(target) if kind != "model" else ctx.decisions.score_model(ctx.model)
    reference = reference_model(ctx)  # the uncompressed model, as an fp32 file of the runtime that ships
    runtime = runtime_of_kind(kind if kind != "model" else "onnx")
    ref_top1 = None if reference is None else ctx.decisions.reference_accuracy(runtime, reference, ctx.full_input_shape)
    split = ctx.data.decision.summary()
    write_json(where, {"stage": record["name"], "top1": top1, "reference_top1": ref_top1, "split": split})


def _write_bundle(ctx: RunContext) -> None:
    """runs/<name>/bundle/: the shipped file with its metadata, predict.py and a README, for whoever
    runs it without effvision (deploy/bundle.py); none when what ships has no torch-free runtime."""
    from .deploy.bundle import write_bundle
    from .deploy.metadata import read_metadata
    from .runtimes import runtime_of_kind, shipped_artifact

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
    # The new data and model are loaded before anything earlier is set aside: a run that cannot
    # start (a missing data path, an unknown model) stops with its finished stages kept.
    model = ctx.initial_model()
    afresh = None
    if (ctx.run_dir / "stages").exists():
        if done.is_file():
            afresh = f"{_what_changed(read_json(done), ctx)} since this run folder was written: starting it afresh"
            log(f"[yellow]{afresh}[/]")
        done.unlink(missing_ok=True)  # the marker first, as in _discard
        shutil.rmtree(ctx.run_dir / "stages")  # nothing earlier is valid
    ctx.model_path = save_checkpoint(model, sdir / "model.pt")
    ctx._model = model
    write_json(
        done,
        {
            "fingerprint": fingerprint,
            "model": ctx.recipe.model.name,
            "inputs": ctx.inputs.identity if ctx.inputs else None,
            "recipe_keys": None if ctx.inputs else _recipe_keys(ctx),
            "started_afresh": afresh,  # why an earlier run in this folder was set aside (None: there was none)
            "artifacts": {"model": ctx.rel(ctx.model_path)},
        },
    )
    return True


def _recipe_keys(ctx: RunContext) -> dict:
    """The recipe's data.*, model.* and seed, flattened: what a changed-inputs message names."""
    resolved = recipe_to_dict(ctx.recipe)
    keys = {f"{part}.{k}": v for part in ("data", "model") for k, v in resolved[part].items()}
    return {**keys, "seed": resolved["seed"]}


def _what_changed(before: dict, ctx: RunContext) -> str:
    """Which of the caller's inputs differ from those a run folder was written with (a recipe's
    data, model or seed when the run has no caller inputs)."""
    old, new = before.get("inputs") or {}, ctx.inputs.identity if ctx.inputs else {}
    if not (old and new):
        keys0, keys1 = before.get("recipe_keys"), _recipe_keys(ctx)
        changed = [k for k in keys1 if keys0 is not None and keys0.get(k) != keys1[k]]
        return f"{', '.join(changed)} changed" if changed else "data, model or seed changed"
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

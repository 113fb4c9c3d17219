"""`effvision search`: a multi-objective study of a recipe on Optuna. Each trial is the recipe with
the values Optuna drew, run as an ordinary run folder under the study's folder (resumable like
any run), its objectives read from the run's report: top-1 of the shipped file in its runtime and
its latency and speed-up as the bench stage measured them beside the reference.

The study lives in a database that Optuna opens (SQLite in the study folder by default; any URL
it accepts, PostgreSQL or MySQL, for workers on several machines). Workers that run the same
command on the same storage and study share its trials: `--trials` is the study's total of
finished trials, whoever ran them. A worker writes a heartbeat while it runs a trial; when a
worker dies, another marks its trial failed (never a result) and runs those values again, in the
same run folder when it is on the same machine, where the run resumes from its last checkpoint."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from ..env import cpu_label
from ..errors import EffvisionError, one_line
from ..fileio import WriteFailed
from ..interrupts import Interrupted
from ..progress import log
from ..recipe import recipe_from_raw, with_value
from .search_space import OBJECTIVES, Dimension

SETTINGS_ATTR = "effvision"  # the study's user attribute holding what it searches
SAMPLERS = ("tpe", "nsga2", "random")  # make_sampler builds each
MAX_FAILURES_IN_A_ROW = 3  # trials of this worker that failed one after another before it gives up


@dataclass
class SearchSettings:
    recipe_file: str
    raw: dict  # the recipe after --set, before the searched values
    dims: list[Dimension]
    objectives: list[str]
    trials: int
    study_name: str
    out_dir: Path
    storage_url: str
    sampler: str = "tpe"
    seed: Optional[int] = None
    timeout_s: Optional[float] = None
    heartbeat_s: int = 60

    def stored(self) -> dict:
        """What must match for a worker to join a study (the data root may differ by machine)."""
        return {
            "recipe": self.raw.get("name"),
            "space": {d.key: d.spec for d in self.dims},
            "objectives": self.objectives,
        }


@dataclass
class WorkerTally:
    ran: int = 0
    failed: int = 0
    failed_in_a_row: int = 0


def default_storage(out_dir: Path) -> str:
    return f"sqlite:///{(out_dir / 'study.db').resolve()}"


def shown_url(url: str) -> str:
    """A storage URL as it may be printed: without its password."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001  (not a URL SQLAlchemy reads: show it as given)
        return url


def open_storage(url: str, heartbeat_s: int | None):
    """Optuna's database storage, with a heartbeat per running trial; one line when the database
    cannot be reached or the URL is not one Optuna takes."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback

    kwargs: dict[str, Any] = {}
    if url.startswith("sqlite"):
        kwargs = {"connect_args": {"timeout": 120}}  # several workers on one file wait for its lock
    elif url.startswith(("postgresql", "mysql")):
        kwargs = {"pool_pre_ping": True, "connect_args": {"connect_timeout": 15}}
    for attempt in range(5):
        try:
            with warnings.catch_warnings():  # Optuna marks the heartbeat experimental; it is what we need
                warnings.simplefilter("ignore")
                heartbeat = {}
                if heartbeat_s:
                    heartbeat = {
                        "heartbeat_interval": heartbeat_s,
                        "grace_period": 3 * heartbeat_s,
                        "heartbeat_stale_trial_callback": RetryHeartbeatStaleTrialCallback(max_retry=3),
                    }
                return RDBStorage(url, engine_kwargs=kwargs, **heartbeat)
        except Exception as exc:  # noqa: BLE001  (SQLAlchemy's and the drivers' errors, a bad URL's ValueError)
            first = one_line(exc)
            # workers that start together race to create Optuna's tables: the loser tries again
            if attempt < 4 and any(w in first for w in ("already exists", "UniqueViolation", "duplicate key")):
                time.sleep(1 + attempt)
                continue
            raise EffvisionError(f"--storage {shown_url(url)}: cannot open the database ({first})") from None


def make_sampler(name: str, seed: Optional[int], trials: int):
    """Optuna's sampler, its random start sized to the study: a third of the trials (at most
    Optuna's 10 for TPE, a generation of at most 50 for NSGA-II), so a small study still spends
    most trials guided. TPE's constant liar keeps parallel workers from drawing one region."""
    import optuna

    start = max(3, min(10, trials // 3))
    if name == "tpe":
        with warnings.catch_warnings():  # constant_liar is marked experimental
            warnings.simplefilter("ignore")
            return optuna.samplers.TPESampler(seed=seed, n_startup_trials=start, constant_liar=True)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=max(4, min(50, trials // 3)))
    return optuna.samplers.RandomSampler(seed=seed)  # "random": the CLI refused any other name


def open_study(s: SearchSettings, storage):
    """Create the study or join it; a study of the same name that searches something else is refused."""
    import optuna

    directions = [OBJECTIVES[o][0] for o in s.objectives]
    try:
        study = optuna.create_study(
            study_name=s.study_name,
            storage=storage,
            directions=directions,
            load_if_exists=True,
        )
        # A seeded worker that joins (or reruns) a study draws on from where the study is, not
        # again from its first values.
        seed = None if s.seed is None else s.seed + len(study.get_trials(deepcopy=False))
        study.sampler = make_sampler(s.sampler, seed, s.trials)
    except Exception as exc:  # noqa: BLE001  (the database refused a write: say it in one line)
        raise EffvisionError(f"study {s.study_name}: the database refused it ({one_line(exc)})") from None
    wanted = s.stored()
    have = study.user_attrs.get(SETTINGS_ATTR)
    if have is None:
        study.set_user_attr(SETTINGS_ATTR, {**wanted, "raw_recipe": s.raw, "recipe_file": s.recipe_file})
    elif {k: have.get(k) for k in wanted} != wanted:
        raise EffvisionError(
            f"study {s.study_name} in {shown_url(s.storage_url)} searches {describe(have)}; this command asks for "
            f"{describe(wanted)}: give --study a new name for a new study"
        )
    name_metrics(study)
    return study


def name_metrics(study) -> None:
    """Optuna's metric names are the objectives' (the dashboard shows them instead of 0, 1, ...)."""
    objectives = study.user_attrs.get(SETTINGS_ATTR, {}).get("objectives")
    if objectives and study.metric_names != objectives:
        with warnings.catch_warnings():  # set_metric_names is marked experimental
            warnings.simplefilter("ignore")
            study.set_metric_names(objectives)


def describe(settings: dict) -> str:
    space = " ".join(f"{k}={v}" for k, v in settings.get("space", {}).items())
    return f"recipe {settings.get('recipe')}, space [{space}], objectives {','.join(settings.get('objectives', []))}"


def load_study(name: Optional[str], url: str):
    """An existing study, for `search show`: by name, or the only one in the storage."""
    import optuna

    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).is_file():
        raise EffvisionError(f"--storage {url}: no such database file (a search writes it; showing creates none)")
    storage = open_storage(url, None)
    names = [st.study_name for st in optuna.get_all_study_summaries(storage, include_best_trial=False)]
    if name is None:
        if len(names) != 1:
            have = ", ".join(names) or "none"
            raise EffvisionError(f"{shown_url(url)} holds {len(names)} studies ({have}): name one with --study")
        name = names[0]
    if name not in names:
        raise EffvisionError(f"{shown_url(url)} has no study '{name}' (studies there: {', '.join(names) or 'none'})")
    study = optuna.load_study(study_name=name, storage=storage)
    if SETTINGS_ATTR not in study.user_attrs:
        raise EffvisionError(f"study {name} in {shown_url(url)} was not made by effvision search (it has no settings)")
    name_metrics(study)
    return study


def trial_folder(values: dict) -> str:
    """A trial's run folder is named by its values, so a trial run again (after its worker died)
    finds the run folder the first attempt left and resumes it."""
    text = json.dumps(values, sort_keys=True, default=str)
    return "t-" + hashlib.sha1(text.encode()).hexdigest()[:10]


def share_finished_stages(trials_dir: Path, run_dir: Path) -> None:
    """Start a new trial's run folder from a finished sibling's stages (hard links; every write is
    a new file renamed into place, so neither folder changes the other): the stages before the
    first searched value have the same inputs, and the pipeline resumes them instead of running
    them again (a trained baseline is trained once per study on each machine)."""
    if run_dir.exists():
        return
    done = sorted(trials_dir.glob("*/report.json"), key=lambda p: p.stat().st_mtime)
    if not done:
        return
    source = done[-1].parent / "stages"
    tmp = run_dir.parent / f".{run_dir.name}.share.tmp"
    shutil.rmtree(tmp, ignore_errors=True)

    def link(src, dst):
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    ignore = shutil.ignore_patterns(".*.tmp", "resume")
    shutil.copytree(source, tmp / "stages", copy_function=link, ignore=ignore)
    tmp.rename(run_dir)


def measured(report: dict, recipe) -> dict:
    """The objectives of a finished run: the shipped file's top-1 on the decision split (its
    reported top-1, on the validation split, beside it as val_top1), its p50 on the bench backend at the recipe's
    target batch (else the smallest benchmarked) and the speed-up over the reference."""
    rows = [s for s in report["stages"] if s.get("accuracy") is not None]
    if not rows:
        raise EffvisionError(f"{report['run_dir']}: no stage measured an accuracy")
    shipped = rows[-1]
    decided = report.get("decision") or {}
    if "top1" not in decided:
        raise EffvisionError(f"{report['run_dir']}: the run scored nothing on a decision split (data.holdout)")
    out: dict[str, Any] = {
        "top1": decided["top1"],  # the objective: the decision split's, never the reported split's
        "val_top1": shipped["accuracy"],
        "size": round(shipped["size_bytes"] / 1e6, 6) if shipped.get("size_bytes") else None,
        "shipped": shipped["name"],
        "evaluated_with": shipped.get("evaluated_with"),
    }
    head = report.get("headline")
    if head:
        target = getattr(recipe, "target", None)
        batch = str(target.batch if target is not None and str(target.batch) in head["speedups"] else head["batch"])
        ref = report["reference"]
        out.update(
            latency_ms=head["final_p50_ms"][batch],
            speedup=head["speedups"][batch],
            reference_p50_ms=head["reference_p50_ms"][batch],
            reference_top1=decided.get("reference_top1"),  # on the decision split, as top1
            val_reference_top1=ref["accuracy"],
            accuracy_delta=head["accuracy_delta"],
            backend=head["backend"],
            batch=int(batch),
        )
    elif shipped.get("latency_ms"):
        lat = shipped["latency_ms"]
        out.update(latency_ms=lat["p50"], backend=lat["backend"], batch=lat["batch"])
    return out


class Surplus(Exception):
    """This worker's new trial would be past the study's total: others already run the rest."""


class TrialFailed(Exception):
    """The trial's run ended with a user error (said in one line); the study goes on."""


class TrialStopped(Exception):
    """The worker was interrupted during the trial (SIGINT/SIGTERM)."""


def _run(recipe, run_dir: Path, deadline_s: float = 3600.0) -> dict:
    """run_pipeline, waiting while another worker of this machine holds the same run folder
    (two trials that drew the same values): the second then resumes what the first finished."""
    from ..pipeline import run_pipeline
    from ..runlock import RunFolderBusy

    waited = time.monotonic()
    while True:
        try:
            return run_pipeline(recipe, run_dir)
        except RunFolderBusy:
            if time.monotonic() - waited > deadline_s:
                raise
            time.sleep(2)


class _Objective:
    """One trial: the recipe with the trial's values, run (resuming what another trial with the
    same values finished), and its objectives measured; what happened is kept in `current`."""

    def __init__(self, s: SearchSettings, study, trials_dir: Path):
        from optuna.trial import TrialState

        self.s, self.study, self.trials_dir = s, study, trials_dir
        self.host, self.cpu = socket.gethostname(), cpu_label()
        self.live = (TrialState.COMPLETE, TrialState.RUNNING, TrialState.WAITING)
        self.stopped: list[BaseException] = []
        self.current: dict[str, int] = {}

    def __call__(self, trial) -> list[float]:
        from optuna.trial import TrialState

        s, current = self.s, self.current
        current["number"] = trial.number
        values = {d.key: d.suggest(trial) for d in s.dims}
        ahead = [t for t in self.study.get_trials(deepcopy=False, states=self.live) if t.number < trial.number]
        if len(ahead) >= s.trials:
            trial.set_user_attr("surplus", True)
            raise Surplus()
        run_dir = self.trials_dir / trial_folder(values)
        got, recipe = self._run(trial, values, run_dir)
        if _trial(self.study, trial.number).state != TrialState.RUNNING:
            current["taken_over"] = True  # another worker failed it meanwhile (its heartbeat came late)
            raise TrialFailed("taken over")
        for key, value in got.items():
            trial.set_user_attr(key, value)
        missing = [o for o in s.objectives if got.get(o) is None]
        if missing:
            trial.set_user_attr("error", f"the run measured no {', '.join(missing)}")
            raise TrialFailed(f"{run_dir}: the run measured no {', '.join(missing)} (does the recipe bench its file?)")
        current["returned"] = True
        return [float(got[o]) for o in s.objectives]

    def _run(self, trial, values: dict, run_dir: Path):
        raw = self.s.raw
        for key, value in values.items():
            raw = with_value(raw, key, value, f"--space {key}")
        for key, value in (("run_dir", str(run_dir)), ("host", self.host), ("pid", os.getpid()), ("cpu", self.cpu)):
            trial.set_user_attr(key, value)
        shown = " ".join(f"{k}={_short(v)}" for k, v in values.items())
        log(f"[bold]trial {trial.number}[/] ({self.host}, pid {os.getpid()}): {shown} -> {run_dir}")
        try:
            recipe = recipe_from_raw(raw, self.s.recipe_file)
            recipe._decided_by = "search"  # trials are chosen by their top-1: on a decision split
            share_finished_stages(self.trials_dir, run_dir)
            return measured(_run(recipe, run_dir), recipe), recipe
        except WriteFailed:
            raise
        except EffvisionError as exc:
            trial.set_user_attr("error", str(exc))
            raise TrialFailed(str(exc)) from None
        except (Interrupted, KeyboardInterrupt) as stop:
            self.stopped.append(stop)
            raise TrialStopped() from None


def run_worker(s: SearchSettings) -> dict:
    """Run trials until the study holds `trials` finished ones (or --timeout); returns the tally."""
    import optuna
    from optuna.trial import TrialState

    storage = open_storage(s.storage_url, s.heartbeat_s)
    study = open_study(s, storage)
    s.out_dir.mkdir(parents=True, exist_ok=True)
    objective = _Objective(s, study, s.out_dir / "trials")
    current = objective.current
    tally, started, waiting_said = WorkerTally(), time.monotonic(), False
    while True:
        with warnings.catch_warnings():  # Optuna marks the function experimental; its behaviour is what we need
            warnings.simplefilter("ignore")
            optuna.storages.fail_stale_trials(study)
        trials = study.get_trials(deepcopy=False)
        complete = sum(t.state == TrialState.COMPLETE for t in trials)
        # queued trials (values to run again) are this worker's to take: only running ones wait
        active = sum(t.state == TrialState.RUNNING for t in trials)
        if complete >= s.trials:
            break
        if s.timeout_s is not None and time.monotonic() - started > s.timeout_s:
            log(f"[yellow]--timeout {s.timeout_s:g} s reached: this worker stops ({complete}/{s.trials} finished)[/]")
            break
        if complete + active >= s.trials:
            # the rest are running elsewhere: wait, in case a worker dies and its trial comes back
            if not waiting_said:
                log(f"[dim]{complete}/{s.trials} finished, {active} running on other workers: waiting[/]")
                waiting_said = True
            time.sleep(min(5, max(1, s.heartbeat_s)))
            continue
        waiting_said = False
        current.clear()
        try:
            study.optimize(objective, n_trials=1, catch=(Surplus, TrialFailed))
        except TrialStopped:
            _retry_later(study, _trial(study, current.get("number")))
            raise objective.stopped[0] from None
        except (optuna.exceptions.UpdateFinishedTrialError, ValueError):
            # another worker failed this trial while it ran (its heartbeat came late) and queued its
            # values again; Optuna then refuses to record it. What this worker measured is not
            # recorded; the queued copy will be. Any other error is a bug: raised.
            if not (current.get("taken_over") or current.get("returned")):
                raise
            log(
                f"[yellow]trial {current.get('number')} was failed by another worker (late heartbeat); "
                "its values run again[/]"
            )
            continue
        _count(study, _trial(study, current.get("number")), s, tally)
    return {"study": study, "tally": tally}


def _count(study, trial, s: SearchSettings, tally: WorkerTally) -> None:
    """A trial this worker ran, finished or failed, into the tally (too many failures in a row stop it)."""
    from optuna.trial import TrialState

    if trial is None or trial.user_attrs.get("surplus"):
        return
    if trial.state == TrialState.COMPLETE:
        tally.ran += 1
        tally.failed_in_a_row = 0
        got = ", ".join(f"{o} {_short(v)}" for o, v in zip(s.objectives, trial.values, strict=True))
        now = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
        log(f"trial {trial.number} finished: {got} ({now}/{s.trials} finished in the study)")
        return
    tally.failed += 1
    tally.failed_in_a_row += 1
    error = trial.user_attrs.get("error", "failed")
    log(f"[yellow]trial {trial.number} failed: {error}[/]")
    if tally.failed_in_a_row >= MAX_FAILURES_IN_A_ROW:
        raise EffvisionError(f"{tally.failed_in_a_row} trials in a row failed; the last: {error}")


def _trial(study, number: Optional[int]):
    return next((t for t in study.get_trials(deepcopy=False) if t.number == number), None)


def _retry_later(study, trial) -> None:
    """An interrupted trial failed (never a result); its values go back into the study, so the
    next worker to ask runs them again (in the same run folder, resuming, on this machine)."""
    if trial is not None and trial.params:
        study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number})
        log(f"[yellow]trial {trial.number} stopped; its values are queued for the next worker[/]")


def _short(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)

"""`effvision search RECIPE --space ...`: a multi-objective study on Optuna over any recipe keys;
`effvision search show`: its table, plot and recipes, and the dashboard command."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from typer.core import TyperGroup

from ..errors import EffvisionError
from .common import out, set_option


class _RunByDefault(TyperGroup):
    """`effvision search RECIPE ...` is `effvision search run RECIPE ...`; `show` is the other command."""

    def parse_args(self, ctx, args):
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


app = typer.Typer(
    cls=_RunByDefault,
    help="Search recipe keys for the Pareto front of top-1 against measured latency (Optuna): "
    "effvision search RECIPE --space KEY=SPEC ... | effvision search show",
    no_args_is_help=True,
)

SPACE_HELP = (
    "A recipe key and its range (repeatable): KEY=LO:HI[:STEP] (float), KEY=int:LO:HI[:STEP], KEY=log:LO:HI, "
    "KEY=choice:A,B,... e.g. stages.prune.ratio=0.2:0.8, stages.distill.epochs=int:1:8, data.image_size=choice:64,96."
)
STORAGE_HELP = (
    "The study's database, any URL Optuna takes (sqlite:///FILE, postgresql://USER@HOST/DB, mysql://...); workers on "
    "several machines share one. Default: sqlite in the study folder."
)
PICK_HELP = "Which trial best.yaml is: max_drop=D (the fastest losing at most D of top-1) or max_latency_ms=L."


def _study_dir(out_dir: Optional[Path], study: str) -> Path:
    return out_dir or Path("runs") / f"search-{study}"


@app.command("run")
def search_run(
    recipe: str = typer.Argument(..., help="Recipe YAML (or a name under compress/) whose keys the search sets."),
    space: List[str] = typer.Option(..., "--space", help=SPACE_HELP),
    objectives: str = typer.Option(
        "top1,latency_ms", help="Comma list of top1 (max), latency_ms (min), speedup (max), size (MB, min)."
    ),
    trials: int = typer.Option(20, min=1, help="The study's total of finished trials, whoever ran them."),
    storage: Optional[str] = typer.Option(None, help=STORAGE_HELP),
    study: Optional[str] = typer.Option(None, help="The study's name (default: the recipe's name)."),
    sampler: str = typer.Option("tpe", help="tpe, nsga2 or random (Optuna's samplers)."),
    seed: Optional[int] = typer.Option(None, help="The sampler's seed (default: none, so workers draw apart)."),
    timeout: Optional[float] = typer.Option(
        None, min=0, help="Start no new trial after this many seconds (the running one finishes)."
    ),
    heartbeat: int = typer.Option(
        60, min=1, help="Seconds between a running trial's heartbeats; a trial silent for 3 of them is failed."
    ),
    pick: Optional[str] = typer.Option(None, help=PICK_HELP + " Default max_drop=0.01."),
    set_: List[str] = set_option(),
    out_dir: Optional[Path] = typer.Option(
        None, "--out", help="The study folder: trial run folders, results (default runs/search-<study>)."
    ),
):
    """Run trials of RECIPE with values drawn over --space until the study holds --trials finished
    ones (other workers on the same --storage and --study share them); then write the Pareto table
    (search.md), pareto.png, front/trial-N.yaml and best.yaml in the study folder."""
    import effvision.stages  # noqa: F401  (registers every stage type before the recipe is checked)

    from ..recipe import raw_recipe, recipe_from_raw
    from ..studies.search import SAMPLERS, SearchSettings, default_storage, run_worker
    from ..studies.search_results import parse_pick
    from ..studies.search_space import check_objectives, check_space, parse_objectives, parse_space

    dims = [parse_space(s) for s in space]
    names = parse_objectives(objectives)
    rule = parse_pick(pick)
    if sampler not in SAMPLERS:
        raise EffvisionError(f"--sampler {sampler}: choose one of {', '.join(SAMPLERS)}")
    file, raw = raw_recipe(recipe, set_)
    base = recipe_from_raw(raw, file)
    check_space(dims, raw, file)
    check_objectives(names, base)
    name = study or base.name
    folder = _study_dir(out_dir, name)
    settings = SearchSettings(
        recipe_file=str(file),
        raw=raw,
        dims=dims,
        objectives=names,
        trials=trials,
        study_name=name,
        out_dir=folder,
        storage_url=storage or default_storage(folder),
        sampler=sampler,
        seed=seed,
        timeout_s=timeout,
        heartbeat_s=heartbeat,
    )
    if storage is None:
        folder.mkdir(parents=True, exist_ok=True)  # the embedded database lives in it
    result = run_worker(settings)
    tally = result["tally"]
    out.print(f"this worker ran {tally.ran} trials ({tally.failed} failed)")
    _show(result["study"], folder, rule, storage)


@app.command("show")
def search_show(
    study: Optional[str] = typer.Option(None, help="The study's name (default: the only one in the storage)."),
    storage: Optional[str] = typer.Option(None, help=STORAGE_HELP.replace("Default", "Default with --study")),
    pick: Optional[str] = typer.Option(None, help=PICK_HELP + " Default max_drop=0.01."),
    retime: bool = typer.Option(
        False,
        "--retime",
        help="Time every finished trial's file of this machine and its reference side by side, interleaved, in one "
        "process (workers sharing a machine time each other's load); best.yaml then uses these p50s.",
    ),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="Where the results go (default runs/search-<study>)."),
):
    """The study's finished trials and Pareto front (search.md, pareto.png, front/, best.yaml),
    and the command that opens it in optuna-dashboard for live viewing."""
    from ..studies.search import default_storage, load_study
    from ..studies.search_results import parse_pick

    rule = parse_pick(pick)
    if storage is None:
        if study is None:
            raise EffvisionError("search show: name the study (--study NAME) or its database (--storage URL)")
        db = _study_dir(out_dir, study) / "study.db"
        if not db.is_file():
            raise EffvisionError(f"search show: no study database at {db} (give --storage URL or --out DIR)")
        url = default_storage(_study_dir(out_dir, study))
    else:
        url = storage
    found = load_study(study, url)
    _show(found, _study_dir(out_dir, found.study_name), rule, storage, retime)


def _show(study, folder: Path, rule, storage: Optional[str], retime: bool = False) -> None:
    from ..studies.search import shown_url
    from ..studies.search_results import write_results

    result = write_results(study, folder, rule, retime)
    out.print(result["markdown"], markup=False)
    out.print(
        f"wrote {', '.join(str(p) for p in result['written'][:3])}" + (" ..." if len(result["written"]) > 3 else "")
    )
    url = shown_url(storage) if storage else f"sqlite:///{folder / 'study.db'}"
    out.print(f"live view: optuna-dashboard {url}   (then open http://127.0.0.1:8080)", markup=False)

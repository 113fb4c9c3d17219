"""`effvision zoo ...`: list and show model cards, the timm compatibility sweep, publishing weights."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from ..errors import EffvisionError
from .common import ARGV, csv, table

app = typer.Typer(help="The model zoo (cards under models/).", no_args_is_help=True)


@app.command("list")
def zoo_list(
    modality: Optional[str] = typer.Option(None, help="image, video or points"),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
):
    """List the zoo's model cards with parameters, MACs, input size and default recipe (a card
    without params/MACs is built and measured)."""
    from ..models import build, count_macs, count_params, resolve
    from ..models.zoo import list_cards
    from ..report_text import fmt_num

    if modality not in (None, "image", "video", "points"):
        raise EffvisionError(f"unknown modality '{modality}' (choices: image, video, points)")
    rows = []
    for card in list_cards(modality):
        params, macs = card.params, card.macs
        if params is None or macs is None:
            model = build(resolve(card.name))
            params, macs = count_params(model), count_macs(model, card.input_size)
        rows.append(
            {
                "name": card.name,
                "arch": card.arch,
                "modality": card.modality,
                "params": params,
                "macs": macs,
                "input_size": card.input_size,
                "num_classes": card.num_classes,
                "dataset": card.dataset,
                "recipe": card.recipe,
                "accuracy": card.trained.accuracy if card.trained else None,
            }
        )
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table(
        "effvision zoo",
        ["name", "modality", "params", "MACs", "input size", "classes", "dataset", "recipe", "trained top-1"],
        [
            [
                r["name"],
                r["modality"],
                fmt_num(r["params"]),
                fmt_num(r["macs"]),
                "x".join(map(str, r["input_size"])),
                str(r["num_classes"]),
                r["dataset"] or "-",
                r["recipe"] or "-",
                "-" if r["accuracy"] is None else f"{r['accuracy']:.4f}",
            ]
            for r in rows
        ],
    )


@app.command("show")
def zoo_show(name: str = typer.Argument(..., help="A card name from `effvision zoo list`.")):
    """Show one model card."""
    from ..models import resolve
    from ..models.zoo import get_card

    resolve(name)  # raises with suggestions for an unknown name
    card = get_card(name)
    if card is None:
        raise EffvisionError(f"'{name}' is an architecture, not a zoo card; cards: `effvision zoo list`")
    print(json.dumps(card.model_dump(mode="json"), indent=2))


@app.command("compat")
def zoo_compat(
    models: Optional[str] = typer.Option(
        None, help="Comma-separated timm model names (default: the built-in list of efficient families)."
    ),
    size: int = typer.Option(224, min=16, help="Input height and width."),
    prune_ratio: float = typer.Option(0.3, min=0.01, max=0.95, help="Channels removed from every prunable group."),
    timeout: float = typer.Option(
        300, min=10, help="Seconds per model; a model still running then is a failure saying where it was stuck."
    ),
    out: Path = typer.Option(
        Path("docs/compat.md"), help="Markdown table to write (a .json with every measurement goes beside it)."
    ),
    runtimes: str = typer.Option(
        "all",
        help="Runtimes besides ONNX Runtime each pruned model is also exported to and checked in, comma-separated "
        "(openvino, litert, executorch), 'all' (those installed here) or 'none'.",
    ),
):
    """Take timm models through create, forward, backward, prune, export, ONNX Runtime parity and int8,
    then each other runtime's fp32 file; write the table."""
    from ..progress import track
    from ..zoo.compat import DEFAULT_MODELS, compat_runtimes, run_compat, runtime_cell, write_compat

    names = csv(models) if models else list(DEFAULT_MODELS)
    others, notes = compat_runtimes(csv(runtimes))
    for note in notes:
        print(note)
    rows = run_compat(names, size=size, prune_ratio=prune_ratio, timeout_s=timeout, progress=track, runtimes=others)
    import shlex

    command = "effvision " + shlex.join(ARGV)  # the table says what wrote it
    path = write_compat(rows, out, size, prune_ratio, command, others, notes)
    table(
        f"{sum(r.ok for r in rows)} of {len(rows)} pass every step",
        ["model", "result", "failing step: reason", *others],
        [
            [
                r.name.removeprefix("timm:"),
                "pass" if r.ok else "[red]FAIL[/]",
                "" if r.ok else f"{r.failed_step}: {r.reason}",
                *(runtime_cell(r.runtimes.get(name)) for name in others),
            ]
            for r in rows
        ],
    )
    print(f"wrote {path}")


@app.command("publish")
def zoo_publish(
    run_dir: Path = typer.Argument(..., help="A finished run folder, e.g. runs/demo."),
    stage: str = typer.Option(..., help="The stage whose model to publish (unpruned, e.g. baseline)."),
    card: Optional[str] = typer.Option(None, help="The zoo card (default: the model name the run used)."),
    write: bool = typer.Option(False, "--write", help="Write the trained: block into the card file (else print it)."),
    half: bool = typer.Option(
        False, "--half", help="Store floating tensors as float16 (half the file; loaded back into float32)."
    ),
):
    """Save a run stage's weights next to its zoo card (safetensors + sha256) with the accuracy, recipe and command."""
    from .. import yamlio
    from ..zoo.publish import append_trained_block, publish

    path, block = publish(run_dir, stage, card, half)
    name = card or path.stem
    if write:
        print(f"wrote {path} and the trained: block of {append_trained_block(name, block)}")
    else:
        print(
            f"wrote {path}; add to the card (or rerun with --write):\n"
            + yamlio.dump({"trained": block}, sort_keys=False, width=1000)
        )

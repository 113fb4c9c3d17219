"""Give a zoo card the weights of a finished run: `effvision zoo publish RUN_DIR --stage NAME`.

Writes <card folder>/weights/<card>.safetensors (plain tensors, nothing pickled) and the card's
`trained:` block: the stage's measured accuracy, the recipe, the command and git commit that
produced it (from the run's env.json), and the file's sha256.
"""

from __future__ import annotations

from pathlib import Path

from .. import yamlio
from ..errors import EffvisionError
from ..fileio import atomic_write, read_json, write_text

# Weights above this size are not committed; a card then says how to reproduce them. (The fine-tuned
# Lite0 in float16, 6.5 MiB, is where every compression study starts: committed.)
MAX_COMMITTED_BYTES = 8 * 1024 * 1024


def _stage(report: dict, name: str) -> dict:
    for s in report["stages"]:
        if s["name"] == name:
            return s
    raise EffvisionError(f"the run has no stage '{name}' (stages: {', '.join(s['name'] for s in report['stages'])})")


def publish(run_dir: str | Path, stage: str, card_name: str | None = None, half: bool = False) -> tuple[Path, dict]:
    """Write the stage's weights next to the card; return (weights file, the `trained:` block).
    half: floating tensors stored as float16 (half the file; loaded back into float32), for a card
    whose top-1 does not change so (score_trained measures it)."""
    from safetensors.torch import save

    from ..models import build, load_checkpoint, resolve
    from ..models.weights import sha256_of
    from ..models.zoo import get_card
    from ..paths import card_files

    run_dir = Path(run_dir)
    if not (run_dir / "report.json").is_file():
        raise EffvisionError(f"{run_dir} is not a finished run (no report.json)")
    report, env = read_json(run_dir / "report.json"), read_json(run_dir / "env.json")
    entry = _stage(report, stage)
    model = load_checkpoint(run_dir / "stages" / entry["stage_dir"] / "model.pt")
    card_name = card_name or model.effvision_spec["name"]
    card = get_card(card_name)
    if card is None:
        raise EffvisionError(f"'{card_name}' is not a zoo card; pass --card NAME")
    state = {k: (v.half() if half and v.is_floating_point() else v).contiguous() for k, v in model.state_dict().items()}
    expected = build(resolve(card.name)).state_dict()
    wrong = [k for k in expected if k not in state or state[k].shape != expected[k].shape]
    if wrong:
        raise EffvisionError(
            f"stage '{stage}' does not fit card {card.name} as built (e.g. {wrong[0]}): publish an unpruned stage of "
            "the card's model"
        )
    path = card_files("models")[card.name].parent / "weights" / f"{card.name}.safetensors"
    path.parent.mkdir(parents=True, exist_ok=True)
    # bytes into the temporary file (made with the umask's mode; save_file would make its own 0600 file)
    atomic_write(path, lambda tmp: tmp.write_bytes(save(state)))
    if path.stat().st_size > MAX_COMMITTED_BYTES:
        print(
            f"note: {path} is {path.stat().st_size / 2**20:.1f} MiB, over the {MAX_COMMITTED_BYTES >> 20} MiB "
            "committed limit: keep it out of git (or publish it with --half); the card's command reproduces it"
        )
    block = {
        "accuracy": round(float(entry["accuracy"]), 4),
        "split": "val",
        "recipe": Path(env.get("recipe") or report["recipe"]).stem,
        "stage": stage,
        "command": env.get("command") or f"effvision train {report['recipe']} --run-dir {run_dir}",
        "weights": str(path.relative_to(path.parent.parent)),
        "sha256": sha256_of(path),
        "commit": env.get("git_sha"),
    }
    held = (report.get("dataset") or {}).get("decision")
    if held:  # the images the run never trained on: the decision split of compressions that start here
        block["holdout"] = {k: held[k] for k in ("n", "of", "seed", "stratified", "sha256")}
    return path, block


def append_trained_block(card_name: str, block: dict) -> Path:
    """Add (or replace) the card file's `trained:` block, keeping the rest of the file as written."""
    from ..paths import card_files

    file = card_files("models")[card_name]
    lines = file.read_text().splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith("trained:")), None)
    if start is not None:  # drop the old block: its line and the indented lines under it
        end = start + 1
        while end < len(lines) and lines[end].startswith((" ", "\t")):
            end += 1
        lines = lines[:start] + lines[end:]
    text = "\n".join(lines).rstrip("\n") + "\n" + yamlio.dump({"trained": block}, sort_keys=False, width=1000)
    return write_text(file, text)


def score_trained(card, overrides: list[str] | None = None) -> float:
    """Top-1 of a card's trained weights (sha256-checked) on the split its recipe validates on,
    rebuilt the way the recipe built it: what the card's `accuracy` claims, measured again."""
    from ..models.builder import create_model
    from ..run_data import recipe_data
    from ..scoring import accuracy, torch_predictor
    from ..stages import load_recipe

    if card.trained is None:
        raise EffvisionError(f"card {card.name} has no trained weights")
    recipe = load_recipe(card.trained.recipe, overrides)
    data = recipe_data(recipe)
    model = create_model(
        card.name, num_classes=data.num_classes, pretrained="zoo", input_size=data.input_size, **recipe.model.kwargs
    )
    return accuracy(torch_predictor(model), data.val_loader())

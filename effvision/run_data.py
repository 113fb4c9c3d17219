"""A recipe's dataset as a run loads it: fed the way its model's weights expect, and with its
decision split (data.holdout) cut as the recipe's stages need it and as the starting zoo card held
it out, with a note where the two do not match."""

from __future__ import annotations

from .recipe import Recipe


def recipe_decides(recipe: Recipe) -> bool:
    """Whether a stage of the recipe (or its caller: a search scores its trials) makes a choice
    that must be scored on a decision split."""
    from .registry import STAGES

    if recipe._decided_by:
        return True
    for stage in recipe.stages:
        cfg = stage if not isinstance(stage, dict) else STAGES.get(stage["type"]).config.model_validate(stage)
        if cfg.decides(recipe):
            return True
    return False


def _card_of(recipe: Recipe):
    from .models.zoo import get_card

    return get_card(recipe.model.name)


def decision_spec(recipe: Recipe) -> dict | None:
    """What decides the run's decision split before any data is read (None: the default of a
    recipe that neither decides nor names one): part of the run's fingerprint, since the split
    changes what the first stages train on."""
    card = _card_of(recipe)
    held = card.trained.holdout if card is not None and card.trained is not None else None
    decides = recipe_decides(recipe)
    if recipe.data.holdout is None and held is None and not decides:
        return None
    return {
        "holdout": recipe.data.holdout,
        "seed": recipe.data.holdout_seed,
        "decides": decides,
        "card": held and held.sha256,
    }


def recipe_data(recipe: Recipe, size: int | None = None):
    """The recipe's dataset: a pretrained card's mean, std and interpolation (its `preprocessing`)
    replace the dataset card's; `size`: images at that side instead (an input size a plan stage
    kept); the decision split as data.holdout says, else (unset) the slice the starting zoo card
    held out, else the default where a stage decides."""
    from .data import load_dataset

    card = _card_of(recipe)
    config = recipe.data if size is None else recipe.data.model_copy(update={"image_size": size})
    held = card.trained.holdout if card is not None and card.trained is not None else None
    if config.holdout is None and held is not None and card.dataset == config.name:
        config = config.model_copy(update={"holdout": held.n, "holdout_seed": held.seed})
    data = load_dataset(
        config, seed=recipe.seed, preprocessing=card.preprocessing if card else None, decides=recipe_decides(recipe)
    )
    if data.decision is not None:
        data.decision.starting_model = starting_model_note(recipe, data.decision.summary())
    return data


def starting_model_note(recipe: Recipe, split: dict) -> str | None:
    """Whether the starting model has seen the decision split's images: a zoo card fine-tuned on
    this dataset either held out the same slice (recorded in the card) or trained on images in it."""
    card = _card_of(recipe)
    trained = card.trained if card is not None else None
    if trained is None or card.dataset != recipe.data.name:
        return None
    if trained.holdout is None:
        return (
            f"the starting model (zoo card {card.name}) was trained on the whole training split: the decision split "
            "holds images it has seen, so decisions are optimistic (rebuild the card with data.holdout)"
        )
    if trained.holdout.sha256 != split["sha256"]:
        return (
            f"the starting model (zoo card {card.name}) held out another slice ({trained.holdout.n} images, "
            f"{trained.holdout.sha256}): the decision split holds images it was trained on"
        )
    return f"the starting model (zoo card {card.name}) held out this slice: it never saw these images"

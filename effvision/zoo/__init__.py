"""Zoo tooling above the pipeline: the conformance run every card passes, the timm compatibility
sweep (docs/compat.md) and publishing a run's weights as a card's `trained:` block. The cards
themselves and the model builders are effvision.models, a lower layer."""

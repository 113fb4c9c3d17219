"""Reach any timm or torchvision classification model by name, with num_classes and input size set."""

from __future__ import annotations

from torch import nn

from ..registry import UnknownNameError, suggest

LIBRARIES = ("timm:", "torchvision:")


def _torchvision_models() -> list[str]:
    import torchvision

    return torchvision.models.list_models(module=torchvision.models) + torchvision.models.list_models(
        module=torchvision.models.video
    )


def check_library_name(arch: str) -> None:
    """An unknown timm:NAME or torchvision:NAME is said as unknown, with the closest names written
    the way the user wrote theirs, before anything else is said about it."""
    library, _, name = arch.partition(":")
    if library == "timm":
        import timm

        if not timm.is_model(name):
            raise UnknownNameError(suggest(arch, [f"timm:{n}" for n in timm.list_models()], "timm model"))
    elif library == "torchvision" and name not in (available := _torchvision_models()):
        raise UnknownNameError(suggest(arch, [f"torchvision:{n}" for n in available], "torchvision model"))


def create_timm(name: str, num_classes: int, input_size: list[int] | None, **kwargs) -> nn.Module:
    import timm

    check_library_name(f"timm:{name}")
    if input_size is not None:
        kwargs.setdefault("pretrained_cfg_overlay", {})["input_size"] = tuple(input_size)
        # timm reads img_size for models whose shape depends on it (ViTs, LeViT); most CNNs and
        # hybrids (FastViT, MobileViT) refuse it, and their entrypoints hide which is which.
        if "img_size" not in kwargs:
            try:
                return timm.create_model(
                    name, pretrained=False, num_classes=num_classes, img_size=input_size[-1], **kwargs
                )
            except TypeError as exc:
                if "img_size" not in str(exc):
                    raise
    return timm.create_model(name, pretrained=False, num_classes=num_classes, **kwargs)


def create_torchvision(name: str, num_classes: int, input_size: list[int] | None, **kwargs) -> nn.Module:
    import torchvision

    check_library_name(f"torchvision:{name}")
    if input_size is not None and name.startswith(("vit", "swin", "maxvit")):
        kwargs.setdefault("image_size", input_size[-1])
    return torchvision.models.get_model(name, weights=None, num_classes=num_classes, **kwargs)


def classifier_of(model: nn.Module) -> nn.Module | None:
    """The final classification layer: the contract's get_classifier(), else the last Linear."""
    if hasattr(model, "get_classifier"):
        head = model.get_classifier()
        if isinstance(head, nn.Module) and not isinstance(head, nn.Identity):
            return head
    last = None
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            last = m
    return last

import pytest

from effvision.errors import EffvisionError
from effvision.registry import BACKENDS, DATASETS, MODELS, STAGES, Registry


def test_register_and_get():
    reg = Registry("widget")

    @reg.register("alpha")
    def alpha():
        return 1

    assert reg.get("alpha") is alpha
    assert "alpha" in reg and reg.names() == ["alpha"] and len(reg) == 1


def test_duplicate_name_raises():
    reg = Registry("widget")
    reg.register("alpha", object())
    with pytest.raises(KeyError, match="already registered"):
        reg.register("alpha", object())


def test_unknown_name_lists_close_matches():
    reg = Registry("widget")
    for n in ("resnet8", "resnet20", "mobilenet"):
        reg.register(n, object())
    with pytest.raises(ValueError) as err:
        reg.get("resnet9")
    assert "did you mean" in str(err.value) and "'resnet8'" in str(err.value)
    assert isinstance(err.value, EffvisionError)  # the CLI shows it as one line


def test_builtin_registries_are_populated():
    import effvision.data  # noqa: F401
    import effvision.deploy  # noqa: F401
    import effvision.models  # noqa: F401
    import effvision.stages  # noqa: F401

    assert {"train", "prune", "distill", "export", "quantize", "bench"} <= set(STAGES.names())
    assert {"digits", "imagefolder"} <= set(DATASETS.names())
    assert {"cifar_resnet8", "cifar_resnet20"} <= set(MODELS.names())
    assert {"torch-eager", "onnxruntime-cpu"} <= set(BACKENDS.names())

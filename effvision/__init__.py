"""effvision: efficient visual recognition end to end (fine-tune, compress, export, benchmark)."""

__version__ = "0.1.0"

import sys
import types

from .errors import EffvisionError  # noqa: E402


class _Package(types.ModuleType):
    """`effvision.compress` is the call effvision.compress(model, train, val, ...) (api.py). The
    stage package of the same name stays importable as effvision.compress.<module>: the import
    system finds it in sys.modules, and the attribute it would bind here is kept aside."""

    @property
    def compress(self):
        from .api import compress

        return compress

    @compress.setter
    def compress(self, package: types.ModuleType) -> None:
        self.__dict__["_compress_package"] = package


sys.modules[__name__].__class__ = _Package


def __getattr__(name):
    # Lazy public API so `import effvision` stays fast (torch loads on first use).
    import importlib

    where = {
        "create_model": "models",
        "list_models": "models",
        "load_checkpoint": "models",
        "load_dataset": "data",
        "load_recipe": "stages",
        "run_pipeline": "pipeline",
        "export": "deploy",
        "benchmark": "deploy",
        "bench_model": "deploy",
        "evaluate": "deploy",
    }
    if name in where:
        return getattr(importlib.import_module(f".{where[name]}", __name__), name)
    raise AttributeError(f"module 'effvision' has no attribute {name!r}")


__all__ = [
    "EffvisionError",
    "compress",
    "create_model",
    "list_models",
    "load_checkpoint",
    "load_dataset",
    "load_recipe",
    "run_pipeline",
    "export",
    "benchmark",
    "bench_model",
    "evaluate",
]

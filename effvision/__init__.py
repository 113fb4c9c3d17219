"""effvision: efficient visual recognition end to end (fine-tune, compress, export, benchmark)."""

__version__ = "0.1.0"

from .errors import EffvisionError


def __getattr__(name):
    # Lazy public API so `import effvision` stays fast (torch loads on first use).
    import importlib

    where = {
        "create_model": "models",
        "list_models": "models",
        "model_card": "models",
        "load_checkpoint": "models",
        "load_dataset": "data",
        "load_recipe": "stages",
        "run_pipeline": "pipeline",
        "export": "deploy",
        "benchmark": "deploy",
        "bench_model": "deploy",
        "evaluate": "deploy",
        "compress": "api",
        "load": "deploy.predictor",
    }
    if name == "stages":  # the stage configs by name: effvision.stages.Train(...)
        return importlib.import_module(".stages", __name__)
    if name in where:
        return getattr(importlib.import_module(f".{where[name]}", __name__), name)
    raise AttributeError(f"module 'effvision' has no attribute {name!r}")


__all__ = [
    "EffvisionError",
    "compress",
    "create_model",
    "list_models",
    "model_card",
    "load_checkpoint",
    "load_dataset",
    "load_recipe",
    "run_pipeline",
    "export",
    "benchmark",
    "bench_model",
    "evaluate",
    "load",
    "stages",
]

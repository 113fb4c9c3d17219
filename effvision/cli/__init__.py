"""The `effvision` command line, one module per command group (zoo, data, study, the pipeline
commands, export/bench); main.py assembles them and handles errors for all."""

from .main import app, entry, main

__all__ = ["app", "entry", "main"]

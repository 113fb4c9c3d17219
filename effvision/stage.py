"""What a pipeline stage is: a small pydantic config plus a handler `run(ctx, cfg) -> StageResult`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from .recipe import StageConfig
from .registry import STAGES


@dataclass
class StageResult:
    """Measured figures of one stage's artifact (see report.json) and the files it wrote."""

    metrics: dict[str, Any] = field(default_factory=dict)
    artifacts: dict[str, str] = field(default_factory=dict)  # kind ("model", "onnx") -> file name in the stage folder


@dataclass(frozen=True)
class Stage:
    config: type[StageConfig]
    run: Callable[[Any, StageConfig], StageResult]


def register_stage(name: str, config: type[StageConfig]) -> Callable:
    """Decorator: register a stage handler with its config class in STAGES."""

    def add(fn: Callable) -> Callable:
        STAGES.register(name, Stage(config=config, run=fn))
        return fn

    return add

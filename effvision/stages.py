"""Imports every module that registers a stage type, so STAGES is complete once this is imported."""

from .compress import stages as _compress  # noqa: F401
from .deploy import stages as _deploy  # noqa: F401
from .train import stage as _train  # noqa: F401

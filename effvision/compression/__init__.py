"""Compression: structured pruning, distillation (a task of the one training loop), the target plan
and the int8 stages (int8 itself is made by effvision/int8 in any runtime's file)."""

from .prune import prune

__all__ = ["prune"]

"""One constructor for every sampler in SAMPLERS (video frames, point clouds): unknown names
and options list the valid ones for that modality."""

from __future__ import annotations

import inspect

from ..errors import EffvisionError
from ..registry import SAMPLERS, suggest


def make_sampler(name: str, modality: str, size: dict, options: dict):
    """SAMPLERS[name](**size, **options), where `size` is the modality's count (num_frames or
    num_points) and `options` the sampler's own (e.g. stride, voxel_size)."""
    names = [n for n in SAMPLERS.names() if getattr(SAMPLERS.get(n), "modality", None) == modality]
    if name not in names:
        raise EffvisionError(suggest(name, names, f"{'video' if modality == 'video' else 'point'} sampler"))
    cls = SAMPLERS.get(name)
    try:
        return cls(**size, **options)
    except TypeError:
        allowed = [p for p in inspect.signature(cls.__init__).parameters if p != "self" and p not in size]
        raise EffvisionError(
            f"sampler '{name}' takes {', '.join(allowed) or 'no options'} besides {', '.join(size)}; "
            f"got {', '.join(options)}"
        ) from None

"""The embedded video dataset: textured shapes that move left, right, up or down, or turn clockwise
or anticlockwise, over a textured background, written as real H.264 mp4 files with PyAV.

A single frame cannot tell the classes apart: every clip starts at a uniformly random position and
angle, and motion wraps around the frame edges, so where a shape is and how it is turned carry no
class information at any time step; only the change between frames does."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from ...errors import EffvisionError
from ..generated import write_once

CLASSES = ["move_left", "move_right", "move_up", "move_down", "turn_clockwise", "turn_anticlockwise"]
VERSION = 2


def _texture(rng: np.random.Generator, size: int, smooth: float) -> Image.Image:
    """A smooth, low-contrast coloured background (the shape must stand out at low resolution)."""
    noise = rng.integers(0, 256, (size // 6 + 1, size // 6 + 1, 3)).astype(np.float32)
    noise = (rng.integers(60, 196, 3) + 0.35 * (noise - 128)).clip(0, 255).astype(np.uint8)
    img = Image.fromarray(noise).resize((size, size), Image.BICUBIC)
    return img.filter(ImageFilter.GaussianBlur(smooth))


def _sprite(rng: np.random.Generator, size: int) -> Image.Image:
    """An irregular polygon (so a turn is visible) filled with a striped, noisy texture."""
    angles = np.sort(rng.uniform(0, 2 * np.pi, int(rng.integers(4, 7))))
    radii = rng.uniform(0.3, 0.5, len(angles)) * size
    c = size / 2
    mask = Image.new("L", (size, size), 0)
    ImageDraw.Draw(mask).polygon(
        [(c + r * np.cos(a), c + r * np.sin(a)) for a, r in zip(angles, radii, strict=True)], fill=255
    )
    base = rng.integers(0, 256, 3)
    stripes = (np.sin(np.arange(size) * rng.uniform(0.5, 1.2))[:, None, None] > 0) * rng.integers(40, 120)
    fill = np.clip(base + stripes + rng.normal(0, 12, (size, size, 3)), 0, 255).astype(np.uint8)
    sprite = Image.fromarray(fill).convert("RGBA")
    sprite.putalpha(mask)
    return sprite


def render_clip(label: int, rng: np.random.Generator, frames: int = 16, size: int = 64) -> np.ndarray:
    """(frames, size, size, 3) uint8 of one clip of class `label`."""
    background = _texture(rng, size, 2.0)
    sprite = _sprite(rng, size // 2)
    pos = rng.uniform(0, size, 2)
    angle = rng.uniform(0, 360)
    speed, turn = rng.uniform(2.0, 3.5), rng.uniform(10.0, 20.0)
    step = {0: (-speed, 0), 1: (speed, 0), 2: (0, -speed), 3: (0, speed)}.get(label, (0, 0))
    spin = {4: -turn, 5: turn}.get(label, 0.0)  # PIL turns anticlockwise for positive angles
    out = np.empty((frames, size, size, 3), np.uint8)
    half = sprite.width // 2
    for t in range(frames):
        frame = background.copy()
        turned = sprite.rotate(angle + spin * t, resample=Image.BILINEAR)
        x, y = (pos + np.array(step) * t) % size
        for dx in (-size, 0, size):  # wrap around the edges
            for dy in (-size, 0, size):
                frame.paste(turned, (int(x - half + dx), int(y - half + dy)), turned)
        out[t] = np.asarray(frame)
    return out


def write_mp4(path: Path, frames: np.ndarray, fps: int = 10) -> None:
    """H.264 (libx264, yuv420p) with a key frame every 8 frames, so keyframe sampling has a choice."""
    import av

    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
        stream.options = {
            "crf": "18",
            "preset": "veryfast",
            "g": "8",
            "keyint_min": "8",
            "sc_threshold": "0",
            "bf": "0",
        }
        for f in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(f, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def generate(
    root: Path,
    train_per_class: int = 48,
    val_per_class: int = 16,
    frames: int = 16,
    size: int = 64,
    seed: int = 0,
    progress=None,
) -> Path:
    """Write <root>/{train,val}/<class>/<n>.mp4 once; reuse it when the parameters match."""
    if size % 2:
        raise EffvisionError(f"synthetic-motion: size must be even (H.264), got {size}")
    params = {
        "version": VERSION,
        "train_per_class": train_per_class,
        "val_per_class": val_per_class,
        "frames": frames,
        "size": size,
        "seed": seed,
    }
    return write_once(
        root,
        params,
        CLASSES,
        {"train": train_per_class, "val": val_per_class},
        lambda folder, label, n, rng: write_mp4(folder / f"{n:04d}.mp4", render_clip(label, rng, frames, size)),
        "generating synthetic-motion videos",
        progress,
    )

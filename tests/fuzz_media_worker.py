"""Reads media files as `effvision data inspect` and the training loaders do, one JSON line per
file: its status, seconds and the process's peak RSS. Run in a child process by
tests/test_fuzz_media.py, so a crash in a native decoder ends this process, not the tests: the
`start` line written before each file names the one that was being read."""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path


def read_like_training(path: Path) -> None:
    """The loader's path for the file's kind (a clip sampled and decoded; a cloud read,
    normalised and sampled; an image decoded)."""
    from effvision.data.cards import DatasetCard
    from effvision.data.images.folders import decode_image, is_image
    from effvision.data.points.datasets import prepare_cloud
    from effvision.data.points.io import is_point_file
    from effvision.data.video.frame_samplers import get_sampler
    from effvision.data.video.io import is_video

    if is_video(path.name):
        get_sampler("tsn", 4).clip(path, 32, train=False)
    elif is_point_file(path.name):
        card = DatasetCard(name="fuzz", source="pointfolder", modality="points", cache_points=256, mesh_points=512)
        prepare_cloud(path, card)
    elif is_image(path.name):
        try:  # ImageFolderDataset skips an image on any exception Pillow raises
            decode_image(path.read_bytes())
        except Exception as exc:  # noqa: BLE001
            raise ValueError(str(exc)) from None


def main(files: list[str]) -> None:
    from effvision.data.images.folders import FileSource
    from effvision.data.inspect import inspect_one
    from effvision.errors import EffvisionError

    for name in files:
        path = Path(name)
        print(json.dumps({"start": name}), flush=True)
        t0 = time.perf_counter()
        status = inspect_one(FileSource(path.parent), path.name)
        try:
            read_like_training(path)
            loader = "ok"
        except EffvisionError as exc:
            loader = f"error: {str(exc).splitlines()[0][:120]}"
        except ValueError as exc:  # decode_image's own refusal of a damaged image
            loader = f"error: {str(exc).splitlines()[0][:120]}"
        seconds = time.perf_counter() - t0
        peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        line = {"file": name, "ok": status["ok"], "error": status.get("error"), "loader": loader}
        print(json.dumps({**line, "seconds": round(seconds, 3), "peak_mib": round(peak_mib)}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])

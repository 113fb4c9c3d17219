"""`search show --retime`: the shipped file of every finished trial and its reference timed side by
side, interleaved, in one process on this machine. Each trial timed its file beside the reference
when it ran, but workers that share a machine time each other's load (a reference that measured
1.6-3.2 ms in eleven trials of a two-worker study read 6.8 ms in one); one interleaved timing of all
of them compares the files, not the moments they ran at."""

from __future__ import annotations

import hashlib
import socket
from pathlib import Path

from ..env import cpu_label
from ..fileio import read_json
from ..progress import log


def _files(row: dict) -> tuple[Path, Path] | None:
    """(shipped ONNX file, reference ONNX file) of a trial run on this machine, else None."""
    run_dir = Path(row.get("run_dir", ""))
    if row.get("host") != socket.gethostname() or not (run_dir / "report.json").is_file():
        return None
    report = read_json(run_dir / "report.json")
    onnx = report.get("artifacts", {}).get("onnx")
    bench = next((s for s in report["stages"] if s["type"] == "bench"), None)
    if onnx is None or bench is None:
        return None
    reference = run_dir / "stages" / bench["stage_dir"] / "reference.onnx"
    return (run_dir / onnx, reference) if reference.is_file() else None


def retime(rows: list[dict], warmup: int = 10, repeats: int = 60, rounds: int = 10) -> dict:
    """Adds `p50_side_by_side` and `speedup_side_by_side` to the rows it could time; trials with
    the same reference file are timed in one interleaved run with it (their backend and batch)."""
    from ..deploy.bench import compare
    from ..runtimes.onnx_files import onnx_input_shape, onnx_precision

    groups: dict[tuple, list[tuple[dict, Path]]] = {}
    references: dict[tuple, Path] = {}
    for r in rows:
        found = _files(r)
        if found is None or r.get("backend") is None:
            continue
        shipped, reference = found
        key = (r["backend"], r["batch"], hashlib.sha256(reference.read_bytes()).hexdigest())
        groups.setdefault(key, []).append((r, shipped))
        references.setdefault(key, reference)
    for key, members in groups.items():
        backend, batch, _sha = key
        files = {"reference": (references[key], "fp32")}
        files.update({f"trial {r['number']}": (f, onnx_precision(f)) for r, f in members})
        log(f"timing {len(files)} files side by side on {backend} at batch {batch}")
        shape = onnx_input_shape(files["reference"][0])
        measured = {
            m["target"]: m["p50"] for m in compare(files, shape, backend, [batch], "cpu", warmup, repeats, rounds)
        }
        for r, _f in members:
            r["p50_side_by_side"] = measured[f"trial {r['number']}"]
            r["speedup_side_by_side"] = round(measured["reference"] / r["p50_side_by_side"], 3)
            r["reference_p50_side_by_side"] = measured["reference"]
    timed = sum(len(m) for m in groups.values())
    return {"cpu": cpu_label(), "trials": timed, "rounds": rounds, "repeats": repeats, "untimed": len(rows) - timed}

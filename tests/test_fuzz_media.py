"""A mutation fuzzer over the real images, clips and point clouds in ../shared/testdata: byte
flips, truncations, header overwrites and zeroed blocks, each mutated file read by `effvision
data inspect` and by the training loaders in a child process. Every file must end in a status
(read, or an error the loaders turn into a skipped sample), in bounded time and memory; a file
that crashed the reader or hung it is a finding, kept under tests/data/fuzz_corpus once fixed.
`make test` mutates 300 files (about 30 s); the slow variant (make test-all) 1,000."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SHARED, needs_shared

WORKER = Path(__file__).with_name("fuzz_media_worker.py")
CORPUS = Path(__file__).parent / "data" / "fuzz_corpus"
SECONDS_PER_FILE, PEAK_MIB = 30, 3072


def sources() -> list[list[Path]]:
    """The real files by kind (images, clips, clouds): each kind gets a third of the mutations."""
    root = SHARED / "testdata"
    kinds = [sorted(p for p in (root / d).rglob("*") if p.is_file()) for d in ("images", "videos", "pointclouds")]
    return [[p for p in files if p.suffix.lower() not in (".md", ".tsv", ".txt", ".json")] for files in kinds]


def mutate(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    b = bytearray(data)
    kind = rng.choice(["flip", "truncate", "header", "zero"])
    if kind == "flip":
        for _ in range(rng.randint(1, 16)):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
    elif kind == "truncate":
        b = b[: rng.randrange(len(b))]
    elif kind == "header":
        for i in range(min(len(b), 64)):
            if rng.random() < 0.25:
                b[i] = rng.randrange(256)
    else:
        start = rng.randrange(len(b))
        b[start : start + rng.randint(16, 4096)] = bytes(min(len(b) - start, rng.randint(16, 4096)))
    return bytes(b), kind


def read_all(files: list[Path]) -> list[dict]:
    """The worker's lines for `files`, in chunks; a chunk that ends early names the file it was on."""
    rows = []
    for start in range(0, len(files), 60):
        chunk = [str(f) for f in files[start : start + 60]]
        try:
            out = subprocess.run(
                [sys.executable, str(WORKER), *chunk],
                capture_output=True,
                text=True,
                timeout=SECONDS_PER_FILE * len(chunk),
            )
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(f"the reader hung on one of {chunk}") from exc
        lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
        done = [line for line in lines if "file" in line]
        if out.returncode != 0 or len(done) != len(chunk):
            current = next((line["start"] for line in reversed(lines) if "start" in line), None)
            raise AssertionError(f"the reader crashed on {current} (exit {out.returncode}): {out.stderr[-800:]}")
        rows += done
    return rows


def fuzz(n: int, seed: int, tmp_path: Path) -> list[dict]:
    rng = random.Random(seed)
    originals = sources()
    mutated = []
    for i in range(n):
        src = rng.choice(originals[i % 3])
        data, kind = mutate(src.read_bytes(), rng)
        dst = tmp_path / f"{i:04d}-{kind}-{src.name}"
        dst.write_bytes(data)
        mutated.append(dst)
    rows = read_all(mutated)
    slow = [r for r in rows if r["seconds"] > SECONDS_PER_FILE]
    assert not slow, slow
    assert max(r["peak_mib"] for r in rows) < PEAK_MIB, max(rows, key=lambda r: r["peak_mib"])
    return rows


@needs_shared
@pytest.mark.slow  # 20 s of mutated real media; make test keeps the hand-made bad files
def test_mutated_media_each_get_a_status(tmp_path):
    rows = fuzz(100, 0, tmp_path)  # a thousand in make bench, below
    assert len(rows) == 100 and sum(not r["ok"] for r in rows) > 0  # mutations do break files


@pytest.mark.slow  # 1,000 files: about 2 minutes
@needs_shared
def test_a_thousand_mutated_media_each_get_a_status(tmp_path):
    rows = fuzz(1000, 1, tmp_path)
    assert len(rows) == 1000


def test_the_regression_corpus_reads_to_a_status(tmp_path):
    """Inputs the fuzzer once found failing, kept after their fix."""
    files = sorted(p for p in CORPUS.glob("*") if p.is_file() and p.name != "README.md") if CORPUS.is_dir() else []
    if not files:
        pytest.skip("the corpus is empty: the fuzzer has found no failing input yet")
    assert len(read_all(files)) == len(files)

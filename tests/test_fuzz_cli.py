"""Command lines no one wrote by hand: hypothesis draws a command of the CLI (from the surface
snapshot, tests/data/cli_surface.json), its arguments and any of its options with values of every
shape (text, numbers, missing and garbage files, option-like words). Every one ends with exit 0, 1
or 2 and at most a one-line error, never a traceback or an internal error, and writes nothing
outside the folder it runs in. `make test` draws 300; the slow variant (make test-all) 10,000.
The recipe, `--set` and preset parsers have their own properties in test_properties.py."""

from __future__ import annotations

import contextlib
import io
import json
import resource
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from effvision.cli import main

ROOT = Path(__file__).resolve().parents[1]
SURFACE = json.loads((ROOT / "tests/data/cli_surface.json").read_text())
# Commands whose defaults start long work on real models (the conformance sweep over every card).
SKIP = {"effvision zoo compat"}
LEAVES = sorted(p for p, spec in SURFACE.items() if not spec["group"] and p not in SKIP)


def _known_names() -> set[str]:
    """Names that would start real work (a recipe, a card, a dataset, an architecture): drawn
    values avoid them, so a draw is a fuzzed input, not a training run."""
    from effvision.models import list_models
    from effvision.paths import card_files

    names = set(list_models()) | set(card_files("data")) | set(card_files("compress")) | set(card_files("models"))
    return {n.lower() for n in names}


KNOWN = _known_names()
words = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
values = st.one_of(
    words,
    st.integers(-(10**6), 10**6).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.sampled_from(["", "-", "--", "-1", "0", "1e9", "nan", "a=b", "x.y=1", "no/such/file.yaml", "GARBAGE"]),
    st.sampled_from(["garbage.onnx", "garbage.pt", "garbage.yaml", "garbage.zip", "folder", "empty.mp4"]),
).filter(lambda v: v.strip().lower() not in KNOWN and "\x00" not in v)


@st.composite
def command_lines(draw) -> list[str]:
    path = draw(st.sampled_from(LEAVES))
    argv = path.split()[1:]
    for p in SURFACE[path]["params"]:
        if p["kind"] == "argument":
            argv += draw(st.lists(values, min_size=1, max_size=2)) if p["multiple"] else [draw(values)]
        elif "--help" not in p["opts"] and draw(st.integers(0, 3)) == 0:
            argv.append(draw(st.sampled_from(p["opts"])))
            if not p["flag"]:
                argv.append(draw(values))
    return argv


def _workspace(tmp: Path) -> None:
    """The files drawn values may name: garbage in every suffix a command reads, a folder, an empty clip."""
    for name in ("garbage.onnx", "garbage.pt", "garbage.yaml", "garbage.zip"):
        (tmp / name).write_bytes(b"\x00garbage\xff" * 8)
    (tmp / "folder").mkdir(exist_ok=True)
    (tmp / "folder" / "x.png").write_bytes(b"not a png")
    (tmp / "empty.mp4").write_bytes(b"")


def _repo_state() -> str:
    return subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout


def check(argv: list[str]) -> None:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    text = err.getvalue()
    assert code in (0, 1, 2), (argv, code, text)
    assert "Traceback" not in text and "internal error" not in text, (argv, text)
    if code == 1:
        lines = [line for line in text.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("effvision"), (argv, text)


def _fuzz(examples: int, tmp_path: Path, monkeypatch) -> None:
    before = _repo_state()
    monkeypatch.chdir(tmp_path)
    _workspace(tmp_path)

    # a command line that runs over 30 s is a hang (hypothesis fails the example at its deadline)
    @settings(max_examples=examples, deadline=30_000, suppress_health_check=list(HealthCheck), database=None)
    @given(argv=command_lines())
    def run(argv):
        check(argv)

    run()
    assert _repo_state() == before, "a fuzzed command wrote into the repository"
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    assert peak_mib < 4096, f"the process grew to {peak_mib:.0f} MiB"


def test_fuzzed_command_lines_end_in_a_result_or_one_line(tmp_path, monkeypatch):
    _fuzz(300, tmp_path, monkeypatch)


@pytest.mark.slow  # 10,000 command lines
def test_ten_thousand_fuzzed_command_lines(tmp_path, monkeypatch):
    _fuzz(10_000, tmp_path, monkeypatch)


def test_the_command_lines_the_fuzzer_found_failing_stay_fixed(tmp_path, monkeypatch):
    """The regression corpus: every command line a fuzz run found failing, kept after its fix."""
    corpus = json.loads((ROOT / "tests/data/fuzz_corpus/cli.json").read_text())
    monkeypatch.chdir(tmp_path)
    _workspace(tmp_path)
    for case in corpus:
        check(case["argv"])

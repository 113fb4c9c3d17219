"""`effvision search`: trials counted across reruns and workers, on the embedded database and on a
real PostgreSQL server; a worker killed mid-trial; the results (front, plot, best.yaml); the
dashboard in headless Chromium; bad input in one line with nothing written."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import tiny_recipe

from effvision.cli.main import main

# conftest's tiny recipe, one epoch of baseline, no int8; the bench times the file beside the reference
TINY = tiny_recipe(
    name="tiny-search",
    stages=[
        {"name": "baseline", "type": "train", "epochs": 1, "optimizer": "adamw", "lr": 3e-3},
        {"type": "prune", "ratio": 0.5},
        {"type": "distill", "epochs": 1},
        {"type": "export"},
        {"type": "bench", "warmup": 1, "repeats": 3, "batches": [1]},
    ],
)
SPACE = ["--space", "stages.prune.ratio=0.2:0.8", "--space", "stages.distill.epochs=int:1:2"]


def write_recipe(folder: Path) -> Path:
    path = folder / "tiny-search.yaml"
    path.write_text(yaml.safe_dump(TINY, sort_keys=False))
    return path


@pytest.fixture
def recipe(tmp_path) -> Path:
    return write_recipe(tmp_path)


def cli(capsys, *args):
    code = main([str(a) for a in args])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def run_cli(*args) -> tuple[int, str, str]:
    """main() with its output captured, for module fixtures (capsys is per test)."""
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in args])
    return code, out.getvalue(), err.getvalue()


def study_of(url: str, name: str = "tiny-search"):
    import optuna

    return optuna.load_study(study_name=name, storage=url)


def states(study) -> dict:
    out: dict = {}
    for t in study.get_trials(deepcopy=False):
        out[t.state.name] = out.get(t.state.name, 0) + 1
    return out


@pytest.fixture(scope="module")
def searched(tmp_path_factory) -> dict:
    """1 trial, the same command again, then --trials 2: what each invocation said."""
    root = tmp_path_factory.mktemp("search")
    folder = root / "study"
    args = ["search", write_recipe(root), *SPACE, "--out", folder, "--seed", 0]
    said = [run_cli(*args, "--trials", n) for n in (1, 1, 2)]
    return {"folder": folder, "said": said, "url": f"sqlite:///{folder / 'study.db'}"}


def test_trials_count_across_reruns_and_results_are_written(searched, capsys):
    folder, said = searched["folder"], searched["said"]
    assert [code for code, _, _ in said] == [0, 0, 0], said[0][2] + said[-1][2]
    assert "this worker ran 1 trials" in said[0][1]
    assert "this worker ran 0 trials" in said[1][1]  # finished: a rerun runs nothing
    assert "this worker ran 1 trials" in said[2][1]

    study = study_of(searched["url"])
    done = [t for t in study.get_trials() if t.state.name == "COMPLETE"]
    assert len(done) == 2 and len({t.user_attrs["run_dir"] for t in done}) == 2
    for t in done:  # objectives are the run's, of the shipped file
        report = yaml.safe_load(Path(t.user_attrs["run_dir"], "report.json").read_text())
        assert t.values[0] == report["decision"]["top1"]  # chosen on the decision split
        assert t.user_attrs["val_top1"] == report["stages"][-1]["accuracy"]  # the reported figure beside it
        assert t.values[1] == report["headline"]["final_p50_ms"]["1"] and t.user_attrs["cpu"]
    # the baseline was trained once: later trials took it over from a finished sibling (one file)
    assert len({Path(t.user_attrs["run_dir"], "stages/1-baseline/model.pt").stat().st_ino for t in done}) == 1
    md = (folder / "search.md").read_text()
    assert "Pareto front" in md and all(f"| {t.number}" in md for t in done)
    assert (folder / "pareto.png").stat().st_size > 1000
    front = sorted(folder.glob("front/trial-*.yaml"))
    assert front and {int(p.stem.split("-")[1]) for p in front} == {t.number for t in study.best_trials}
    best = yaml.safe_load((folder / "best.yaml").read_text())
    picked = next(t for t in done if t.params["stages.prune.ratio"] == best["stages"][1]["ratio"])
    assert best["stages"][2]["epochs"] == picked.params["stages.distill.epochs"]
    code, out, err = cli(capsys, "search", "show", "--study", "tiny-search", "--out", folder)
    assert code == 0 and "live view: optuna-dashboard sqlite:///" in out, err


def test_show_retime_times_every_file_side_by_side(searched, capsys):
    folder = searched["folder"]
    code, out, err = cli(capsys, "search", "show", "--study", "tiny-search", "--out", folder, "--retime")
    assert code == 0, err
    md = (folder / "search.md").read_text()
    assert "Side by side: 2 trials' files and their reference timed interleaved in one process" in md
    head = next(line for line in md.splitlines() if line.startswith("| trial"))
    assert "p50 ms side by side" in head and "speed-up side by side" in head
    rows = [line.split("|") for line in md.splitlines() if line.startswith("| ") and not line.startswith("| trial")]
    col = head.split("|").index(" speed-up side by side ")
    assert len(rows) == 2 and all(float(r[col].strip().rstrip("x")) > 0 for r in rows)


def test_the_side_by_side_front_uses_the_side_by_side_timings():
    from effvision.studies.search_results import side_by_side_front

    rows = [  # trial 1 looked fastest while it ran (a loaded reference), side by side it is not
        {"number": 0, "top1": 0.80, "speedup": 3.0, "speedup_side_by_side": 3.1},
        {"number": 1, "top1": 0.70, "speedup": 7.8, "speedup_side_by_side": 3.0},
        {"number": 2, "top1": 0.60, "speedup": 3.5, "speedup_side_by_side": 3.6},
    ]
    assert side_by_side_front(rows, ["top1", "speedup"]) == {0, 2}


def test_best_yaml_runs_as_a_recipe(tmp_path):
    """The picked recipe is the study's recipe with the trial's values (a fake study's rows)."""
    from effvision.stages import load_recipe
    from effvision.studies.search_results import pick

    rows = [
        {"number": 0, "top1": 0.95, "reference_top1": 0.96, "latency_ms": 2.0},
        {"number": 1, "top1": 0.94, "reference_top1": 0.96, "latency_ms": 1.0},
        {"number": 2, "top1": 0.90, "reference_top1": 0.96, "latency_ms": 0.5},
    ]
    assert pick(rows, ("max_drop", 0.005))[0] is None
    assert pick(rows, ("max_drop", 0.02))[0]["number"] == 1
    assert pick(rows, ("max_drop", 0.1))[0]["number"] == 2
    assert pick(rows, ("max_latency_ms", 1.5))[0]["number"] == 1
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(TINY))
    assert load_recipe(path, ["stages.prune.ratio=0.3"]).stages[1].ratio == 0.3


def test_trials_from_two_cpus_are_said_apart(tmp_path):
    """Latencies of one CPU compare only with that CPU's: the table and the plot say so."""
    import optuna
    from optuna.distributions import FloatDistribution

    from effvision.studies.search_results import write_results

    study = optuna.create_study(study_name="mixed", directions=["maximize", "minimize"])
    study.set_user_attr(
        "effvision",
        {"recipe": "tiny-search", "space": {"r": "0.2:0.8"}, "objectives": ["top1", "latency_ms"], "raw_recipe": TINY},
    )
    for i, (cpu, top1, ms) in enumerate([("cpu A", 0.9, 1.0), ("cpu A", 0.8, 2.0), ("cpu B", 0.85, 0.5)]):
        attrs = {"cpu": cpu, "latency_ms": ms, "reference_top1": 0.9, "reference_p50_ms": 2.0, "size": 0.1 + i}
        study.add_trial(
            optuna.trial.create_trial(
                params={"stages.prune.ratio": 0.2 + i / 10},
                distributions={"stages.prune.ratio": FloatDistribution(0.2, 0.8)},
                values=[top1, ms],
                user_attrs=attrs,
            )
        )
    result = write_results(study, tmp_path, ("max_drop", 0.06))
    assert "Latencies come from 2 CPUs (cpu A; cpu B)" in result["markdown"]
    assert {r["number"] for r in result["rows"] if r["front"]} == {0, 2}  # trial 1 is dominated
    assert result["chosen"]["number"] == 2 and (tmp_path / "pareto.png").stat().st_size > 1000
    assert sorted(p.name for p in (tmp_path / "front").iterdir()) == ["trial-0.yaml", "trial-2.yaml"]


def test_a_trial_failed_by_another_worker_is_run_again(recipe, tmp_path, capsys, monkeypatch):
    """Another worker may fail a running trial whose heartbeat came late and queue its values:
    the worker that ran it records nothing of it and goes on (here the other worker is simulated
    at the moment the run ends)."""
    import optuna
    from optuna.trial import TrialState

    from effvision.studies import search

    folder, fired = tmp_path / "study", []
    url = f"sqlite:///{folder / 'study.db'}"
    real = search.measured

    def measured_after_a_late_heartbeat(report, r):
        if not fired:
            study = optuna.load_study(study_name="tiny-search", storage=url)
            (t,) = study.get_trials(states=(TrialState.RUNNING,))
            study._storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
            study.enqueue_trial(t.params)
            fired.append(t.number)
        return real(report, r)

    monkeypatch.setattr(search, "measured", measured_after_a_late_heartbeat)
    code, out, err = cli(capsys, "search", recipe, *SPACE, "--trials", 1, "--out", folder)
    assert code == 0, err
    trials = study_of(url).get_trials()
    assert [t.state.name for t in trials] == ["FAIL", "COMPLETE"] and trials[1].params == trials[0].params


def _worker(recipe: Path, folder: Path, url: str | None, trials: int, log: Path) -> subprocess.Popen:
    args = [sys.executable, "-m", "effvision.cli", "search", str(recipe), *SPACE, "--trials", str(trials)]
    args += ["--out", str(folder), "--heartbeat", "2"] + (["--storage", url] if url else [])
    env = {**os.environ, "EFFVISION_QUIET": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(args, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)


@pytest.mark.slow  # 35 s; sharing on PostgreSQL with a killed worker is in make bench too (below)
def test_two_workers_share_one_embedded_study(recipe, tmp_path):
    folder = tmp_path / "study"
    folder.mkdir()
    procs = [_worker(recipe, folder, None, 4, tmp_path / f"w{i}.log") for i in range(2)]
    for i, p in enumerate(procs):
        assert p.wait(timeout=300) == 0, (tmp_path / f"w{i}.log").read_text()[-2000:]
    study = study_of(f"sqlite:///{folder / 'study.db'}")
    done = [t for t in study.get_trials() if t.state.name == "COMPLETE"]
    assert len(done) == 4 and states(study).get("RUNNING", 0) == 0
    ran = [
        int(line.split()[3])
        for i in range(2)
        for line in (tmp_path / f"w{i}.log").read_text().splitlines()
        if line.startswith("this worker ran")
    ]
    assert sum(ran) == 4 and len({t.number for t in done}) == 4  # each trial run once, the count adds up
    assert {t.user_attrs["pid"] for t in done} == {p.pid for p in procs}


@pytest.mark.slow  # 30 s
def test_sigterm_fails_the_trial_queues_its_values_and_a_rerun_resumes_them(recipe, tmp_path):
    folder = tmp_path / "study"
    folder.mkdir()
    url = f"sqlite:///{folder / 'study.db'}"
    worker = _worker(recipe, folder, None, 2, tmp_path / "w.log")
    running = None
    for _ in range(400):  # the first trial, once its prune stage has begun
        time.sleep(0.3)
        try:
            trials = study_of(url).get_trials()
        except Exception:  # noqa: BLE001  (the study is not created yet)
            continue
        running = next(
            (
                t
                for t in trials
                if t.state.name == "RUNNING" and Path(t.user_attrs.get("run_dir", "/-"), "stages/2-prune").is_dir()
            ),
            None,
        )
        if running:
            break
    assert running is not None, (tmp_path / "w.log").read_text()[-2000:]
    os.kill(worker.pid, signal.SIGTERM)
    assert worker.wait(timeout=60) == 143
    assert "interrupted by SIGTERM" in (tmp_path / "w.log").read_text()
    baseline = Path(running.user_attrs["run_dir"], "stages/1-baseline/metrics.json")
    finished_before = baseline.stat().st_mtime_ns  # finished before the prune stage began
    again = _worker(recipe, folder, None, 2, tmp_path / "w2.log")
    assert again.wait(timeout=300) == 0, (tmp_path / "w2.log").read_text()[-2000:]
    trials = study_of(url).get_trials()
    assert trials[running.number].state.name == "FAIL"
    retry = next(t for t in trials if t.user_attrs.get("retry_of") == running.number)
    assert retry.state.name == "COMPLETE" and retry.params == running.params
    assert retry.user_attrs["run_dir"] == running.user_attrs["run_dir"]
    assert baseline.stat().st_mtime_ns == finished_before  # what the stopped attempt finished is resumed


# ----------------------------------------------------------------------------- PostgreSQL
def _pg_bin(name: str) -> str | None:
    import glob
    import shutil

    return shutil.which(name) or next(iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))[-1:]), None)


@pytest.fixture
def postgres(tmp_path):
    """A PostgreSQL server of the distribution's packages on a loopback port, in a fresh cluster,
    run by the package's `postgres` user when we are root (the server refuses root)."""
    import pwd
    import socket
    import tempfile

    initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
    if not (initdb and pg_ctl):
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) are missing: apt-get install postgresql")
    pytest.importorskip("psycopg2", reason="the PostgreSQL driver psycopg2 is not installed")
    as_user: list[str] = []
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no 'postgres' user to run the server")
        as_user = ["runuser", "-u", "postgres", "--"]
    data = Path(tempfile.mkdtemp(prefix="effvision-pg-"))
    if as_user:
        os.chown(data, pwd.getpwnam("postgres").pw_uid, -1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = lambda *a: subprocess.run([*as_user, *a], check=True, capture_output=True, timeout=120)  # noqa: E731
    run(initdb, "-D", str(data / "db"), "-A", "trust", "-U", "postgres", "--no-sync")
    opts = f"-p {port} -k {data} -c listen_addresses=127.0.0.1 -c fsync=off"
    run(pg_ctl, "-D", str(data / "db"), "-o", opts, "-l", str(data / "log"), "-w", "start")
    try:
        yield f"postgresql+psycopg2://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*as_user, pg_ctl, "-D", str(data / "db"), "-m", "immediate", "stop"], capture_output=True)
        subprocess.run(["rm", "-rf", str(data)])


@pytest.mark.slow  # 45 s; make test keeps a trial failed by another worker run again
def test_postgres_workers_share_a_study_and_survive_a_killed_worker(recipe, tmp_path, postgres):
    folder = tmp_path / "study"
    folder.mkdir()
    a = _worker(recipe, folder, postgres, 3, tmp_path / "a.log")
    b = _worker(recipe, folder, postgres, 3, tmp_path / "b.log")
    killed = None
    deadline = time.monotonic() + 120
    while killed is None and time.monotonic() < deadline:  # a's first trial, once its run has started
        time.sleep(0.3)
        try:
            running = [t for t in study_of(postgres).get_trials() if t.state.name == "RUNNING"]
        except Exception:  # noqa: BLE001  (the study is not created yet)
            continue
        mine = [t for t in running if t.user_attrs.get("pid") == a.pid]
        if mine and Path(mine[0].user_attrs["run_dir"], "stages").is_dir():
            os.killpg(a.pid, signal.SIGKILL)
            killed = mine[0]
    assert killed is not None, (tmp_path / "a.log").read_text()[-2000:]
    a.wait(timeout=30)
    assert b.wait(timeout=300) == 0, (tmp_path / "b.log").read_text()[-3000:]
    study = study_of(postgres)
    trials = {t.number: t for t in study.get_trials()}
    done = [t for t in trials.values() if t.state.name == "COMPLETE"]
    assert len(done) == 3 and trials[killed.number].state.name == "FAIL"  # never reported as a result
    assert killed.number not in {t.number for t in study.best_trials}
    retried = [t for t in done if t.system_attrs.get("failed_trial") == killed.number]
    assert retried and retried[0].params == killed.params  # its values ran again, by the survivor
    assert retried[0].user_attrs["run_dir"] == killed.user_attrs["run_dir"]  # in the folder it left


# ----------------------------------------------------------------------------- the dashboard
def test_the_dashboard_shows_the_study_in_headless_chromium(searched, tmp_path):
    import shutil
    import socket

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    dashboard = shutil.which("optuna-dashboard") or str(Path(sys.executable).with_name("optuna-dashboard"))
    if not chromium:
        pytest.skip("headless Chromium is missing: apt-get install chromium")
    if not Path(dashboard).is_file():
        pytest.skip("optuna-dashboard is not installed")
    folder = searched["folder"]
    params = study_of(searched["url"]).trials[0].params
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [dashboard, f"sqlite:///{folder / 'study.db'}", "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}/dashboard/studies/1/trials"
        flags = "--headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking"
        flags += f" --disable-component-update --disable-sync --user-data-dir={tmp_path / 'chromium'}"
        dom = ""
        for _ in range(20):  # the server takes a moment to start
            time.sleep(0.5)
            got = subprocess.run(
                [chromium, *flags.split(), "--virtual-time-budget=8000", "--dump-dom", url],
                capture_output=True,
                text=True,
                timeout=60,
            )
            dom = got.stdout
            if "Trial 0" in dom:
                break
        assert "Trial 0" in dom and "stages.prune.ratio" in dom, dom[-1000:]
        assert str(params["stages.prune.ratio"])[:6] in dom
    finally:
        server.terminate()
        server.wait(timeout=10)


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "extra, fragments",
    [
        (["--space", "stages.prune.ration=0.2:0.8"], ["unknown key", "did you mean 'ratio'"]),
        (["--space", "stages.prune.ratio=0.8:0.2"], ["the range is empty"]),
        (["--space", "stages.prune.ratio=choice:"], ["the choice is empty"]),
        (["--space", "stages.distill.epochs=1:4"], ["stages.distill.epochs=1:4", "integer"]),
        (["--space", "stages.qat.epochs=int:1:4"], ["no item named 'qat'"]),
        (["--space", "stages.prune.ratio=0.2:0.8", "--objectives", "top-1,latency_ms"], ["did you mean 'top1'"]),
        (
            ["--space", "stages.prune.ratio=0.2:0.8", "--storage", "postgresql+psycopg2://u@127.0.0.1:1/db"],
            ["cannot open the database"],
        ),
        (["--space", "stages.prune.ratio=0.2:0.8", "--storage", "nosuchdb://x"], ["cannot open the database"]),
        (["--space", "stages.prune.ratio=0.2:0.8", "--pick", "fastest"], ["--pick fastest"]),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(recipe, tmp_path, capsys, extra, fragments):
    folder = tmp_path / "study"
    code, _, err = cli(capsys, "search", recipe, *extra, "--out", folder)
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert code == 1 and len(lines) == 1 and lines[0].startswith("effvision: error:"), err
    for f in fragments:
        assert f in lines[0], (f, lines[0])
    assert not folder.exists()

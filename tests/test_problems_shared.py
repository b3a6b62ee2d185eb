"""`gemm-tune tune --problems FILE --storage URL` shared by worker processes (a fake GPU
each, tests/_problems_worker.py; one SQLite storage): they take disjoint problems that
together cover the set, every worker's summary shows every winner, and a worker killed
while it holds a problem has it taken over by another once its lease runs out, with
nothing tuned twice when the set is run again."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import optuna
from optuna.trial import TrialState

from tuner._shared_problems import DEFAULT_STUDY
from tuner._study import open_storage

HERE = Path(__file__).parent
LINES = [dict(dtype="f32", m=m, n=n, k=k, calls=c, ms=ms)
         for m, n, k, c, ms in [(16, 512, 256, 100, 30.0), (256, 256, 256, 9, 20.0),
                                (64, 128, 512, 7, 10.0), (128, 64, 128, 5, 5.0)]]
LABELS = ["16x512x256 f32 nn C f32", "256x256x256 f32 nn C f32", "64x128x512 f32 nn C f32",
          "128x64x128 f32 nn C f32"]


def _problems(tmp_path) -> Path:
    path = tmp_path / "problems.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in LINES))
    return path


def _worker(url, problems, artifacts, delay=0.05, lease=3.0, go=None):
    cmd = [sys.executable, str(HERE / "_problems_worker.py"), url, str(problems),
           str(artifacts), "--tests", str(HERE), "--delay", str(delay), "--lease", str(lease)]
    return subprocess.Popen(cmd + (["--go", str(go)] if go else []), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _rows(p, timeout=300):
    out, err = p.communicate(timeout=timeout)
    assert p.returncode == 0, err[-3000:]
    return json.loads(out), err


def _me(p) -> str:
    return f"{socket.gethostname()}:{p.pid}"


def _claims(url):
    storage = open_storage(url)
    study = optuna.load_study(study_name=DEFAULT_STUDY, storage=storage)
    return study.trials


def test_two_workers_take_disjoint_problems_that_cover_the_set(tmp_path):
    url, problems = f"sqlite:///{tmp_path / 'shared.db'}", _problems(tmp_path)
    go = tmp_path / "go"
    workers = [_worker(url, problems, tmp_path / f"host{i}", go=go) for i in range(2)]
    for w in workers:  # both started before either takes a problem
        assert w.stderr.readline().strip() == "ready"
    go.touch()
    summaries = [_rows(w)[0] for w in workers]
    tuned = [{r["problem"] for r in rows if r["worker"] == _me(w)}
             for w, rows in zip(workers, summaries)]
    assert tuned[0] and tuned[1] and not tuned[0] & tuned[1]  # disjoint, both worked
    assert tuned[0] | tuned[1] == set(LABELS)  # together: all
    for rows in summaries:  # each shows every problem's winner, the same one
        assert [r["problem"] for r in rows] == LABELS
        assert all(r["kernel"] and r["ratio"] > 0 for r in rows)
    assert [(r["kernel"], r["ratio"]) for r in summaries[0]] == [
        (r["kernel"], r["ratio"]) for r in summaries[1]]
    # each tuned its own problems only: its cache holds those, not the other's
    for i, mine in enumerate(tuned):
        entries = json.loads((tmp_path / f"host{i}" / "cache.json").read_text())["entries"]
        assert len(entries) == len(mine)
    trials = _claims(url)
    assert len(trials) == 4 and {t.state for t in trials} == {TrialState.COMPLETE}


def test_a_killed_workers_problem_is_taken_over_and_a_rerun_tunes_nothing_again(tmp_path):
    url, problems = f"sqlite:///{tmp_path / 'shared.db'}", _problems(tmp_path)
    victim = _worker(url, problems, tmp_path / "victim", delay=2.0)
    deadline = time.monotonic() + 120
    held = []
    while not held and time.monotonic() < deadline and victim.poll() is None:
        time.sleep(0.2)
        try:
            held = [t for t in _claims(url) if t.state == TrialState.RUNNING]
        except KeyError:  # the study is not there yet
            pass
    assert held, "the victim did not claim a problem"
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    survivor = _worker(url, problems, tmp_path / "survivor", lease=2.0)
    rows, err = _rows(survivor)
    assert [r["problem"] for r in rows] == LABELS
    assert all(r["kernel"] and r["worker"] == _me(survivor) for r in rows)
    assert f"held by {_me(victim)}, waiting" in err
    [lost] = [t for t in _claims(url) if t.state == TrialState.FAIL]
    assert lost.user_attrs["problem"] == held[0].user_attrs["problem"]
    assert "released" in lost.user_attrs["reason"]
    # run again (a fresh worker, another host): every winner from the storage, none tuned
    again = _worker(url, problems, tmp_path / "again")
    rows2, _ = _rows(again)
    assert [(r["kernel"], r["worker"]) for r in rows2] == [(r["kernel"], r["worker"])
                                                          for r in rows]
    assert not (tmp_path / "again" / "cache.json").exists()

"""Shared studies: claims, leases and retries (tuner._study), on SQLite, journal files,
in memory (every interleaving of claim, finish and crash, by hypothesis) and on a real
PostgreSQL server (three processes, a SIGKILL, a database restart).

The PostgreSQL tests need $GEMM_TUNE_TEST_POSTGRES (a SQLAlchemy URL; .ci/run starts a
server and sets it). Without it they skip, except under CI (CI=true), where they fail.
"""

import collections
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import optuna
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState

from tuner._study import SharedStudy, open_storage, study_state

optuna.logging.set_verbosity(optuna.logging.WARNING)
HERE = Path(__file__).parent
DIST = dict(x=CategoricalDistribution(tuple(range(100))))


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def _workers(storage, names, clock, interval=1.0, grace=5.0):
    sid = optuna.create_study(storage=storage, study_name="s", load_if_exists=True)._study_id
    return [SharedStudy(storage, sid, worker=w, interval=interval, grace=grace, clock=clock,
                        retry_s=5) for w in names]


def _census(trials):
    """name -> states of the trials that claimed it (withdrawn ones left out)."""
    out = collections.defaultdict(list)
    for t in trials:
        if "duplicate_of" not in t.user_attrs and t.user_attrs.get("claim"):
            out[t.user_attrs["claim"]].append((t.state, t.user_attrs.get("outcome"),
                                               t.user_attrs.get("reason")))
    return out


def _done_once(census, names):
    """Every name done exactly once (timed, or failed with an outcome and a reason); every
    other trial of it released with a reason; nothing left RUNNING."""
    for name in names:
        rows = census[name]
        done = [r for r in rows if r[0] in (TrialState.COMPLETE, TrialState.PRUNED)
                or (r[0] == TrialState.FAIL and r[1])]
        assert len(done) == 1, (name, rows)
        assert all(r[2] for r in done if r[0] == TrialState.FAIL), (name, rows)
        rest = [r for r in rows if r not in done]
        assert all(r[0] == TrialState.FAIL and r[2] for r in rest), (name, rows)


@pytest.fixture(params=["sqlite", "journal"])
def storage(request, tmp_path):
    if request.param == "sqlite":
        return open_storage(f"sqlite:///{tmp_path / 's.db'}")
    return open_storage(f"journal:///{tmp_path / 's.log'}")


def test_lease_releases_a_silent_workers_claims(storage):
    clock = Clock()
    a, b = _workers(storage, ["a", "b"], clock)
    a.beat()
    b.beat()
    ta = a.propose("k1", {"x": 1}, DIST, {})
    assert a.confirm(ta, "k1", budget=10) is None
    tb = b.propose("k1", {"x": 1}, DIST, {})
    assert b.confirm(tb, "k1", budget=10) == "held"  # a's claim is live
    clock.t = 3.0
    b.beat()
    b.read()
    assert b.claims()["k1"].status == "running"  # within the grace period
    clock.t = 7.0  # a has not renewed for 7 s > 5 s: its claim is failed and released
    b.read()
    states = {t._trial_id: t for t in b.trials}
    assert states[ta].state == TrialState.FAIL and "released" in states[ta].user_attrs["reason"]
    assert [t.user_attrs["claim"] for t in b.released()] == ["k1"]
    tb2 = b.propose("k1", {"x": 1}, DIST, {})
    assert b.confirm(tb2, "k1", budget=10) is None  # retried by the survivor
    assert b.finish(tb2, {"outcome": "timed"}, TrialState.COMPLETE, 1.0)
    assert not a.finish(ta, {"outcome": "timed"}, TrialState.COMPLETE, 2.0)  # too late
    assert a.lost == 1
    _done_once(_census(storage.get_all_trials(a.study_id)), ["k1"])


def test_a_renewed_lease_keeps_its_claims_and_a_clean_stop_frees_them(storage):
    clock = Clock()
    a, b = _workers(storage, ["a", "b"], clock)
    a.beat()
    ta = a.propose("k1", {"x": 1}, DIST, {})
    assert a.confirm(ta, "k1", budget=None) is None
    for t in range(1, 30):  # 29 s, renewed every second: never stale
        clock.t = float(t)
        a.beat()
        b.read()
        assert b.claims()["k1"].status == "running"
    a.stop(clean=True)  # (a real stop first fails its unfinished claims)
    b._read_leases(force=True)
    assert not b.alive("a")


def test_the_budget_is_the_studys(storage):
    clock = Clock()
    a, b = _workers(storage, ["a", "b"], clock)
    for w in (a, b):
        w.beat()
    got = []
    for i in range(6):
        w = (a, b)[i % 2]
        tid = w.propose(f"k{i}", {"x": i}, DIST, {})
        got.append(w.confirm(tid, f"k{i}", budget=4))
    assert got == [None] * 4 + ["full"] * 2
    a.read()
    assert len(a.held()) == 4


def test_heartbeat_thread_renews_the_lease(tmp_path):
    storage = open_storage(f"sqlite:///{tmp_path / 'h.db'}")
    sid = optuna.create_study(storage=storage, study_name="h")._study_id
    w = SharedStudy(storage, sid, worker="w", interval=0.1, grace=1.0).start()
    try:
        first = storage.get_study_user_attrs(sid)["lease:w"]["n"]
        time.sleep(0.5)
        assert storage.get_study_user_attrs(sid)["lease:w"]["n"] >= first + 2
    finally:
        w.stop()
    assert storage.get_study_user_attrs(sid)["lease:w"] == "stopped"


# -- every interleaving of claim, finish and crash, in memory ------------------------------

NAMES = [f"k{i}" for i in range(5)]
OPS = st.lists(st.tuples(st.sampled_from(["propose", "confirm", "finish", "crash", "tick"]),
                         st.integers(0, 2)), max_size=40)


class _Worker:
    def __init__(self, shared):
        self.s, self.alive, self.proposed, self.held = shared, True, None, []

    def next_free(self):
        self.s.read()
        claims = self.s.claims()
        return next((n for n in NAMES if n not in claims or claims[n].status == "released"),
                    None)

    def propose(self):
        if self.proposed is None:
            name = self.next_free()
            if name is not None:
                self.proposed = (self.s.propose(name, {"x": int(name[1:])}, DIST, {}), name)

    def confirm(self):
        if self.proposed is not None:
            tid, name = self.proposed
            self.proposed = None
            if self.s.confirm(tid, name, budget=len(NAMES)) is None:
                self.held.append((tid, name))

    def finish(self, timed):
        if self.held:
            tid, name = self.held.pop(0)
            if name == "k3":  # one candidate fails for good, with a reason
                ok = self.s.finish(tid, {"outcome": "launch failed", "reason": "fault"},
                                   TrialState.FAIL)
            else:
                ok = self.s.finish(tid, {"outcome": "timed"}, TrialState.COMPLETE, 1.0)
            if ok:
                timed.append(name)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS, n=st.integers(2, 3))
def test_interleavings_of_claim_finish_and_crash(ops, n):
    """Any interleaving of two or three workers claiming, finishing and crashing on one
    study; then the survivors (one is kept alive) go on until the study is done. Every
    candidate ends done exactly once (timed, or failed with a reason); nothing RUNNING."""
    storage = optuna.storages.InMemoryStorage()
    clock = Clock()
    ws = [_Worker(s) for s in _workers(storage, [f"w{i}" for i in range(n)], clock)]
    for w in ws:
        w.s.beat()
    timed: list[str] = []
    for op, i in ops:
        w = ws[i % n]
        if op == "tick":
            clock.t += 2.0
            for x in ws:
                if x.alive:
                    x.s.beat()
        elif not w.alive:
            continue
        elif op == "crash" and w is not ws[0]:  # the first always survives
            w.alive = False
        elif op == "propose":
            w.propose()
        elif op == "confirm":
            w.confirm()
        elif op == "finish":
            w.finish(timed)
    # the survivors finish their work, wait out the crashed leases, and retry what is left
    for _ in range(40):
        clock.t += 2.0
        for w in ws:
            if w.alive:
                w.s.beat()
                w.confirm()
                while w.held:
                    w.finish(timed)
                w.propose()
                w.confirm()
    trials = storage.get_all_trials(ws[0].s.study_id)
    _done_once(_census(trials), NAMES)
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    assert sorted(timed) == sorted(set(timed)), "a result was recorded twice"


# -- PostgreSQL ------------------------------------------------------------------------------

@pytest.fixture
def pg_url():
    url = os.environ.get("GEMM_TUNE_TEST_POSTGRES")
    if not url:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("CI=true but GEMM_TUNE_TEST_POSTGRES is not set: .ci/run starts a "
                        "PostgreSQL server and sets it", pytrace=False)
        pytest.skip("no PostgreSQL server: set GEMM_TUNE_TEST_POSTGRES (see .ci/postgres.sh)")
    return url


def _spawn(url, study, log, cache, trials, delay=0.1, seed=4, lease="0.5,4", retry=60.0):
    return subprocess.Popen(
        [sys.executable, str(HERE / "_dist_worker.py"), url, "--study", study, "--log",
         str(log), "--cache", str(cache), "--tests", str(HERE), "--trials", str(trials),
         "--delay", str(delay), "--seed", str(seed), "--lease", lease, "--retry", str(retry),
         "--timeout", "240"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_lines(log, n, procs, limit=180):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if log.exists() and len(log.read_text().split()) >= n:
            return
        if all(p.poll() is not None for p in procs):
            return
        time.sleep(0.1)
    raise AssertionError(f"the workers did not get going within {limit} s")


def _final(url, study, trials, released_ok: bool = False):
    """The study ends with its budget done, nothing running or stale, and nothing released
    (unless `released_ok`: after a storage outage a claim failed by it may stay released
    when the others had met the budget before anyone retried it; nothing is lost then)."""
    storage = open_storage(url)
    state = study_state(storage, study)[0]
    sid = storage.get_study_id_from_name(study)
    census = _census(storage.get_all_trials(sid))
    assert state["done"] == trials and len(census) >= trials, state
    assert state["running"] == state["stale"] == 0, state
    assert released_ok or state["released"] == 0, state
    _done_once(census, [n for n in census if any(r[0] != TrialState.FAIL or r[1]
                                                  for r in census[n])])
    return census, state


def test_postgres_three_processes_one_study(pg_url, tmp_path, compile_cache):
    study, log, trials = f"three-{uuid.uuid4().hex[:8]}", tmp_path / "timed.log", 15
    procs = [_spawn(pg_url, study, log, compile_cache, trials, delay=0.05) for _ in range(3)]
    outs = [p.communicate(timeout=400) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-1500:] for o in outs]
    stats = [json.loads(o[0].splitlines()[-1]) for o in outs]
    names = log.read_text().split()
    assert len(names) == len(set(names)) == sum(s["timed"] for s in stats)  # none twice
    census, state = _final(pg_url, study, trials)
    timed = sorted(n for n, rows in census.items() if any(r[0] == TrialState.COMPLETE
                                                          for r in rows))
    assert timed == sorted(names)  # none lost: every timing is in the study
    assert sum(s["duplicates"] for s in stats) > 0  # they did ask for each other's


def test_postgres_sigkill_one_of_three(pg_url, tmp_path, compile_cache):
    """One worker is SIGKILLed while it holds claims: the others fail them once its lease
    (4 s) runs out, retry them, and the study still ends with exactly the budget."""
    study, trials = f"kill-{uuid.uuid4().hex[:8]}", 24
    logs = [tmp_path / f"timed{i}.log" for i in range(3)]
    # slow enough that it cannot finish the budget alone before the others are up
    victim = _spawn(pg_url, study, logs[0], compile_cache, trials, delay=1.5, seed=1)
    _wait_lines(logs[0], 2, [victim])
    others = [_spawn(pg_url, study, logs[i], compile_cache, trials, delay=0.1, seed=i + 1)
              for i in (1, 2)]
    _wait_lines(logs[0], 3, [victim])
    assert victim.poll() is None, "the victim ended before it could be killed"
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    storage = open_storage(pg_url)
    sid = storage.get_study_id_from_name(study)
    held = {t.user_attrs["claim"] for t in storage.get_all_trials(sid)
            if t.state == TrialState.RUNNING and t.user_attrs.get("worker", "").endswith(
                f":{victim.pid}")}
    t_kill = time.monotonic()
    outs = [p.communicate(timeout=400) for p in others]
    assert all(p.returncode == 0 for p in others), [o[1][-1500:] for o in outs]
    census, _ = _final(pg_url, study, trials)
    for name in held:  # each claim the victim held is done by a survivor
        rows = census[name]
        assert any("released" in (r[2] or "") for r in rows), rows
    survivors = [n for lg in logs[1:] if lg.exists() for n in lg.read_text().split()]
    assert len(survivors) == len(set(survivors))  # the survivors timed nothing twice
    assert time.monotonic() - t_kill < 200


def test_postgres_restart_mid_study(pg_url, tmp_path, compile_cache):
    """The database stops and starts while three workers run: they retry with backoff
    and finish, or stop with a one-line error naming the storage; none hangs."""
    pgctl = os.environ.get("GEMM_TUNE_TEST_PGCTL")
    if not pgctl:
        pytest.skip("GEMM_TUNE_TEST_PGCTL (how to stop and start the server) is not set")
    study, log, trials = f"restart-{uuid.uuid4().hex[:8]}", tmp_path / "timed.log", 18
    procs = [_spawn(pg_url, study, log, compile_cache, trials, delay=0.2, seed=i)
             for i in range(3)]
    _wait_lines(log, 3, procs)
    subprocess.run(f"{pgctl} stop -m fast", shell=True, check=True, capture_output=True)
    time.sleep(3)
    subprocess.run(f"{pgctl} start", shell=True, check=True, capture_output=True)
    outs = [p.communicate(timeout=400) for p in procs]  # bounded: none hangs
    for p, (out, err) in zip(procs, outs):
        if p.returncode != 0:
            last = err.strip().splitlines()[-1]
            assert p.returncode == 2 and last.startswith("gemm-tune: error: storage "), err[-1500:]
    if all(p.returncode == 0 for p in procs):
        _final(pg_url, study, trials, released_ok=True)


def test_a_storage_that_cannot_be_reached_is_reported_once_with_the_time_waited(caplog):
    """Every retry is a debug line; the user hears of the failure once, when the retries
    give up, with how long they waited."""
    import logging

    from tuner._study import _retry
    from tuner.errors import StorageError

    calls = []

    def unreachable():
        calls.append(time.monotonic())
        raise OSError("connection refused\nsecond line")

    caplog.set_level(logging.WARNING)
    with pytest.raises(StorageError) as e:
        _retry(unreachable, "opening", 1.0, "postgresql://db.example/x")
    assert len(calls) >= 3  # retried with backoff
    assert [r for r in caplog.records if r.name == "tuner._study"] == []
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("storage postgresql://db.example/x: opening failed")
    assert "waited 1 s" in msg and "OSError: connection refused" in msg


# -- one transaction per claim and per result (tuner._rdb_batch) ---------------------------

@pytest.fixture(params=["sqlite", "postgresql"])
def rdb_url(request, tmp_path):
    """An RDB storage URL: a fresh SQLite file, or the PostgreSQL server (unique studies)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'rdb.db'}"
    return request.getfixturevalue("pg_url")


def _commits(storage):
    """A list that grows by one per transaction that writes and commits on `storage`."""
    import sqlalchemy

    engine, seen = storage._backend.engine, []

    def statement(conn, cursor, sql, params, context, many):
        if sql.lstrip().split()[0].upper() in ("INSERT", "UPDATE", "DELETE"):
            conn.info["wrote"] = True

    sqlalchemy.event.listen(engine, "before_cursor_execute", statement)
    sqlalchemy.event.listen(engine, "commit", lambda conn: conn.info.pop("wrote", False)
                            and seen.append(1))
    sqlalchemy.event.listen(engine, "rollback", lambda conn: conn.info.pop("wrote", None))
    return seen


def _rdb_workers(url, names, clock, study=None, **kw):
    storage = open_storage(url)
    study = study or f"b-{uuid.uuid4().hex[:8]}"
    sid = optuna.create_study(storage=storage, study_name=study, load_if_exists=True)._study_id
    return storage, [SharedStudy(storage, sid, worker=w, clock=clock, retry_s=30, **kw)
                     for w in names]


def test_a_claim_and_a_result_are_one_commit_each_and_a_withdrawn_claim_none(rdb_url):
    storage, (a, b) = _rdb_workers(rdb_url, ["a", "b"], Clock())
    assert a.batch is not None
    commits = _commits(storage)
    ta, why = a.claim("k1", {"x": 1}, DIST, {}, budget=10)
    assert why is None and len(commits) == 1
    assert a.held() == {"k1"}  # counted before the next read
    assert b.claim("k1", {"x": 1}, DIST, {}, budget=10) == (None, "held")
    assert len(commits) == 1  # rolled back: nothing of b's is in the study
    assert a.finish(ta, {"outcome": "timed", "kernel": "k1", "figures": {"bound": 2.5}},
                    TrialState.COMPLETE, 1.5)
    assert len(commits) == 2
    [t] = storage.get_all_trials(a.study_id)
    assert (t._trial_id, t.number, t.state, t.value) == (ta, 0, TrialState.COMPLETE, 1.5)
    assert t.params == {"x": 1} and t.distributions == DIST
    assert t.user_attrs == dict(claim="k1", kernel="k1", worker="a", outcome="timed",
                                figures={"bound": 2.5})
    assert not b.finish(ta, {"outcome": "timed"}, TrialState.COMPLETE, 9.0)  # ended: no change
    assert storage.get_all_trials(a.study_id)[0].value == 1.5


def test_a_claim_against_a_silent_workers_claim_fails_that_claim_in_the_same_commit(rdb_url):
    """A claim that stands only because another worker's claim on the name is stale (its
    lease silent) fails that claim as it commits, so the silent worker's result, should it
    come after all (a database outage, not a death), is dropped: one result per name."""
    clock = Clock()
    storage, (a, b) = _rdb_workers(rdb_url, ["a", "b"], clock, interval=1.0, grace=5.0)
    a.beat()
    ta, _ = a.claim("k1", {"x": 1}, DIST, {}, budget=10)
    b.read()  # b sees a's lease now ...
    clock.t = 7.0  # ... and not renewed for 7 s > 5 s
    commits = _commits(storage)
    tb, why = b.claim("k1", {"x": 1}, DIST, {}, budget=10)
    assert why is None and len(commits) == 1
    assert not a.finish(ta, {"outcome": "timed"}, TrialState.COMPLETE, 2.0)  # too late
    assert b.finish(tb, {"outcome": "timed"}, TrialState.COMPLETE, 1.0)
    census = _census(storage.get_all_trials(a.study_id))
    _done_once(census, ["k1"])
    assert "released: worker a stopped renewing its lease" in census["k1"][0][2]


def test_a_claim_fails_every_claim_of_a_silent_worker_that_it_did_not_count(rdb_url):
    """The budget is judged without a silent worker's claims, so the claim that stands on
    that judgement fails them as it commits: should the silent worker come back and
    finish them, the study still holds no more than its budget."""
    clock = Clock()
    storage, (a, b) = _rdb_workers(rdb_url, ["a", "b"], clock, interval=1.0, grace=5.0)
    a.beat()
    ta, _ = a.claim("k1", {"x": 1}, DIST, {}, budget=1)
    b.read()
    clock.t = 7.0
    tb, why = b.claim("k2", {"x": 2}, DIST, {}, budget=1)
    assert why is None  # a's claim on k1 no longer counts ...
    assert not a.finish(ta, {"outcome": "timed"}, TrialState.COMPLETE, 2.0)  # ... nor lands
    assert b.finish(tb, {"outcome": "timed"}, TrialState.COMPLETE, 1.0)
    b.read()
    assert b.held() == {"k2"} and [t.user_attrs["claim"] for t in b.released()] == ["k1"]


def test_results_queued_together_are_written_in_one_commit(rdb_url):
    """What the writer thread found queued goes in one transaction; a claim that another
    worker failed meanwhile is dropped from it (and counted lost), the others land."""
    storage, (a, b) = _rdb_workers(rdb_url, ["a", "b"], Clock())
    ids = [a.claim(f"k{i}", {"x": i}, DIST, {}, budget=None)[0] for i in range(4)]
    assert b._end(ids[0], {"reason": "released: a test"}, TrialState.FAIL)
    commits = _commits(storage)
    for i, tid in enumerate(ids):
        a.finish_later(tid, {"outcome": "timed"}, TrialState.COMPLETE, float(i))
    a.flush()
    assert 1 <= len(commits) <= 2 and a.lost == 1  # one, unless the writer woke in between
    more = [a.claim(f"m{i}", {"x": i}, DIST, {}, budget=None)[0] for i in range(3)]
    commits.clear()
    a._finish_all([(tid, {"outcome": "timed"}, TrialState.COMPLETE, 1.0) for tid in more])
    assert len(commits) == 1  # what the writer takes at once: one commit
    values = {t._trial_id: (t.state, t.value) for t in storage.get_all_trials(a.study_id)}
    assert values[ids[0]] == (TrialState.FAIL, None)
    assert [values[t] for t in ids[1:]] == [(TrialState.COMPLETE, float(i)) for i in (1, 2, 3)]
    assert all(values[t] == (TrialState.COMPLETE, 1.0) for t in more)


def test_one_transaction_writes_the_trials_optunas_own_calls_write(tmp_path, monkeypatch):
    """The same claims and ends through tuner._rdb_batch and through Optuna's storage calls
    give the same trials: numbers, states, values, parameters, attributes, and times in
    the local zone (Optuna 5 stores UTC) whatever the zone."""
    import datetime

    monkeypatch.setenv("TZ", "Asia/Kolkata")  # UTC+5:30: a time stored in the wrong zone shows
    time.tzset()
    try:
        studies = []
        for batch in (True, False):
            url = f"sqlite:///{tmp_path / f'{batch}.db'}"
            storage, (w,) = _rdb_workers(url, ["w"], Clock(), study="same")
            if not batch:
                w.batch = None
            before = datetime.datetime.now()
            ids = [w.claim(f"k{i}", {"x": i}, DIST, {"note": i}, budget=None)[0]
                   for i in range(3)]
            assert w.finish(ids[0], {"outcome": "timed", "kernel": "k0"}, TrialState.COMPLETE,
                            2.0)
            assert w.finish(ids[1], {"outcome": "pruned", "figures": {"f": [1, 2]}},
                            TrialState.PRUNED)
            assert w.finish(ids[2], {"outcome": "launch failed", "reason": "fault"},
                            TrialState.FAIL)
            trials = storage.get_all_trials(w.study_id)
            for t in trials:
                assert before - datetime.timedelta(seconds=1) <= t.datetime_start
                assert t.datetime_start <= t.datetime_complete <= datetime.datetime.now()
            studies.append([(t.number, t.state, t.value, t.params, t.distributions,
                             t.user_attrs) for t in trials])
        assert studies[0] == studies[1]
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


def test_racing_claims_stand_once_per_name_and_up_to_the_budget(rdb_url):
    """Four workers, each with its own connections, claim the same twelve names in the same
    order at once, with a budget of eight: each name stands for one of them, eight in all,
    and no withdrawn claim is left in the study."""
    import threading

    storages = [open_storage(rdb_url) for _ in range(4)]
    study = f"race-{uuid.uuid4().hex[:8]}"
    sid = optuna.create_study(storage=storages[0], study_name=study)._study_id
    workers = [SharedStudy(s, sid, worker=f"w{i}", retry_s=30) for i, s in enumerate(storages)]
    start = threading.Barrier(len(workers))
    won: dict[str, list] = {w.worker: [] for w in workers}

    def claim_all(w):
        start.wait()
        for i in range(12):
            tid, why = w.claim(f"k{i}", {"x": i}, DIST, {}, budget=8)
            if why is None:
                won[w.worker].append(f"k{i}")

    threads = [threading.Thread(target=claim_all, args=(w,)) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    names = [n for got in won.values() for n in got]
    assert len(names) == len(set(names)) == 8, won
    trials = storages[0].get_all_trials(sid)
    assert len(trials) == 8 and {t.state for t in trials} == {TrialState.RUNNING}
    assert sorted(t.number for t in trials) == list(range(8))
    assert sorted(t.user_attrs["claim"] for t in trials) == sorted(names)


def test_a_storage_of_another_schema_or_kind_goes_through_optunas_calls(tmp_path, monkeypatch):
    from optuna.storages import RDBStorage

    from tuner._rdb_batch import batched

    assert batched(open_storage(f"journal:///{tmp_path / 'j.log'}")) is None
    assert batched(optuna.storages.InMemoryStorage()) is None
    assert batched(open_storage(f"sqlite:///{tmp_path / 'a.db'}")) is not None
    monkeypatch.setattr(RDBStorage, "get_current_version", lambda self: "v9.9.9.z")
    storage, (a, b) = _rdb_workers(f"sqlite:///{tmp_path / 'b.db'}", ["a", "b"], Clock())
    assert a.batch is None  # then a claim is propose + confirm, and still works
    ta, why = a.claim("k1", {"x": 1}, DIST, {}, budget=10)
    assert why is None
    assert b.claim("k1", {"x": 1}, DIST, {}, budget=10) == (None, "held")
    assert a.finish(ta, {"outcome": "timed"}, TrialState.COMPLETE, 1.0)
    census = _census(storage.get_all_trials(a.study_id))
    assert census == {"k1": [(TrialState.COMPLETE, "timed", None)]}


@pytest.mark.parametrize("schema", ["ours", "another"])
def test_a_saved_study_is_what_optunas_copy_study_writes(tmp_path, monkeypatch, schema):
    """search.save_study (one transaction for the trials where the schema is known, else
    optuna.copy_study) against optuna.copy_study of the same study: every trial's number,
    state, values, parameters, attributes, intermediate values and times (in a zone away
    from UTC), the study's directions and attributes; and saving again replaces it."""
    import types

    from optuna.storages import RDBStorage

    from tuner.search import save_study

    if schema == "another":
        monkeypatch.setattr(RDBStorage, "get_current_version", lambda self: "v9.9.9.z")
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    try:
        study = optuna.create_study(direction="maximize")
        study.set_user_attr("shape", [64, 64, 64])
        dist = {**DIST, "f": optuna.distributions.FloatDistribution(0.5, 2.0, log=True)}
        states = [TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL, TrialState.RUNNING]
        for i in range(9):
            state = states[i % 4]
            study.add_trial(optuna.trial.create_trial(
                params={"x": i % 4, "f": 0.5 + i / 10}, distributions=dist, state=state,
                value=10.0 + i if state is TrialState.COMPLETE else None,
                user_attrs={"outcome": state.name, "figures": {"f": [i, 1.5]}},
                system_attrs={"seed": i}, intermediate_values={0: 1.0, 2: float(i)}
                if i % 3 == 0 else {}))
        result = types.SimpleNamespace(study=study, storage=study._storage)
        db = tmp_path / "studies.db"
        save_study(result, db, "ours")
        save_study(result, db, "ours")  # replaced, not added to
        optuna.copy_study(from_study_name=study.study_name, from_storage=study._storage,
                          to_storage=f"sqlite:///{db}", to_study_name="optuna")

        def read(name):
            s = optuna.load_study(study_name=name, storage=f"sqlite:///{db}")
            return s.directions, s.user_attrs, [
                (t.number, t.state, t.values, t.params, t.distributions, t.user_attrs,
                 t.system_attrs, t.intermediate_values, t.datetime_start, t.datetime_complete)
                for t in s.get_trials()]

        ours, theirs = read("ours"), read("optuna")
        assert len(ours[2]) == 9 and ours == theirs
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


@pytest.mark.parametrize("scheme", ["sqlite:///", "journal:///"])
def test_a_storage_file_in_a_missing_directory_is_refused_at_once(tmp_path, scheme):
    """No retries for a file whose directory is not there (they waited seconds, then gave
    up with SQLite's 'unable to open database file' after a warning line): one UsageError
    naming the directory, nothing created."""
    import time

    from codegen.errors import UsageError

    t0 = time.monotonic()
    with pytest.raises(UsageError, match="is not a directory"):
        open_storage(f"{scheme}{tmp_path / 'missing' / 's.db'}", retry_s=30)
    assert time.monotonic() - t0 < 1.0 and not (tmp_path / "missing").exists()

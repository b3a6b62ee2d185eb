"""The shared side of a search: one Optuna study in a storage that several processes, on
one host or several, join (SQLite, PostgreSQL, or a journal file).

What lives in the shared study, and what each process does with it:

- A **claim** is a RUNNING trial created in one write, its parameters and the user
  attributes ``claim`` (the candidate's name), ``kernel`` and ``worker`` (host:pid) with
  it. A process claims a candidate before compiling it: it writes its claim, then reads
  the study; if another live claim holds the same name, or the study already holds the
  budget, it withdraws (``duplicate_of``; PRUNED). Of two processes that race, at most one
  goes on (each writes before it reads, so the later reader sees both).
- A **lease**: each process renews the study attribute ``lease:<worker>`` every
  `interval` seconds from a thread. Another process that sees a lease unchanged for
  `grace` seconds of its own clock (no clocks are compared across hosts) fails that
  worker's RUNNING claims with the reason; a failed claim without an outcome is
  *released*, and the survivors retry it, so no candidate is lost.
- A claim is **done** once COMPLETE, PRUNED, or FAIL with an outcome (compile failed,
  launch failed, wrong result): it is never timed again.

On SQLite and PostgreSQL a claim is one transaction that writes the claim, reads the
study's claims and commits only if it stands (a withdrawn one leaves nothing behind), and
a claim's end is one transaction (tuner._rdb_batch); elsewhere (a journal file, memory)
they go through Optuna's storage calls, a claim as :meth:`SharedStudy.propose` then
:meth:`SharedStudy.confirm`. Reading the study is incremental (Optuna's cached storage
reads only unfinished trials and new ones), and the view of the claims is worked out once
per read.

Every storage call is retried with backoff for `retry_s` seconds (a database restart, a
dropped connection); after that a :class:`StorageError` names the storage in one line.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import queue
import re
import socket
import threading
import time
from pathlib import Path
from typing import Callable

from codegen.errors import UsageError
from tuner._rdb_batch import batched
from tuner.errors import StorageError

__all__ = ["StorageError", "SharedStudy", "open_storage", "describe", "study_state", "WORKER",
           "LEASE_INTERVAL", "LEASE_GRACE"]

log = logging.getLogger(__name__)

#: who holds a claim: host and process
WORKER = f"{socket.gethostname()}:{os.getpid()}"
#: default lease: renewed every 10 s, a worker silent for 60 s is taken for dead
LEASE_INTERVAL, LEASE_GRACE = 10.0, 60.0
#: outcomes that end a claim for good (the candidate is never timed again)
FINAL = frozenset({"timed", "pruned", "compile failed", "launch failed", "wrong result"})
STOPPED = "stopped"  # the lease of a worker that ended cleanly


def describe(url) -> str:
    """A storage URL without its password, for messages."""
    if not isinstance(url, str):
        return type(url).__name__
    return re.sub(r"://([^:/@]+):[^@]*@", r"://\1:***@", url)


def _retry(fn: Callable, what: str, retry_s: float, where: str):
    """fn() until it succeeds, backing off 0.1 s .. 5 s, for at most `retry_s` seconds.

    Optuna's own logic errors (KeyError for an unknown study, a finished trial) are not
    retried: only errors of the storage itself (the database, the file system)."""
    import optuna

    start = time.monotonic()
    deadline = start + retry_s
    delay = 0.1
    while True:
        try:
            return fn()
        except (KeyError, ValueError, RuntimeError, optuna.exceptions.UpdateFinishedTrialError,
                optuna.exceptions.DuplicatedStudyError):
            raise
        except Exception as e:  # noqa: BLE001 - sqlalchemy, psycopg, OSError: retried
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
            if time.monotonic() + delay > deadline:
                raise StorageError(f"storage {where}: {what} failed; waited "
                                   f"{time.monotonic() - start:.0f} s for it "
                                   f"({type(e).__name__}: {first})") from None
            # the user hears of it once, when the retries give up (with the time waited)
            (log.debug if delay > 0.1 else log.info)(
                "storage %s: %s failed (%s); retrying for up to %g s", where, what, first,
                retry_s)
            time.sleep(delay)
            delay = min(delay * 2, 5.0)


def not_a_store(path, kind: str) -> str | None:
    """Why the file at `path` cannot be a study store of `kind` ("sqlite" or "journal"),
    or None: it is one, is empty or is not there (a new store). Read, never written. An
    SQLite file is asked through SQLite itself, read-only: a plain open() and close() of it
    would drop every POSIX lock this process's own SQLite connections hold on it (close()
    releases a process's locks on the file), and another process could then write under
    them (SQLite's "how to corrupt a database", 2.2)."""
    path = Path(path)
    if path.is_dir():
        return "is a directory"
    if not path.is_file() or path.stat().st_size == 0:
        return None
    if kind == "sqlite":
        import sqlite3
        import urllib.parse

        try:
            con = sqlite3.connect(f"file:{urllib.parse.quote(str(path.resolve()))}?mode=ro",
                                  uri=True, timeout=30)
            try:
                con.execute("PRAGMA schema_version").fetchone()
            finally:
                con.close()
        except sqlite3.DatabaseError as e:  # (a lock held elsewhere is not the file's fault)
            if "not a database" in str(e) or "malformed" in str(e):
                return "is not an SQLite database"
        return None
    try:
        with open(path, "rb") as f:  # (a journal's locks are files of their own)
            first = f.readline(1 << 20)
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
    try:
        op = json.loads(first)
    except ValueError:
        op = None
    return None if isinstance(op, dict) and "op_code" in op else \
        "is not an Optuna journal file"


def storage_file(url) -> Path | None:
    """The file a storage URL names (sqlite:///FILE, journal:///PATH), or None (a server,
    an in-memory database, a storage object)."""
    if not isinstance(url, str):
        return None
    file = (url[len("sqlite:///"):] if url.startswith("sqlite:///")
            else url[len("journal://"):] if url.startswith("journal:///") else None)
    return Path(file) if file and file != ":memory:" else None


def check_studies_file(db: Path) -> None:
    """UsageError (one line) where the artifacts' studies.db is there and not an SQLite
    database: a tune would fail to save its study into it, report to read one."""
    if (why := not_a_store(db, "sqlite")) is not None:
        raise UsageError(f"studies {db} {why}: move it aside (a tune writes a new one)")


def open_storage(url, retry_s: float = 60.0):
    """An Optuna storage from a URL: an RDB URL (sqlite:///FILE, postgresql+psycopg://...,
    postgresql://... is taken as psycopg's) or journal:///PATH (a journal file, for several
    processes or hosts on a shared file system). Storage objects pass through."""
    import optuna

    if not isinstance(url, str):
        return url
    file = storage_file(url)
    if file and not file.parent.is_dir():
        # a file in a directory that is not there never opens: say so now, not after retries
        raise UsageError(f"--storage {url}: {file.parent} is not a directory")
    if file and (why := not_a_store(file, "journal" if url.startswith("journal:") else "sqlite")):
        raise UsageError(f"--storage {url}: {file} {why}")
    if url.startswith("journal:///"):
        from optuna.storages.journal import JournalFileBackend

        path = str(file)
        return optuna.storages.JournalStorage(JournalFileBackend(path, lock_obj=_FairLock(path)))
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        url = "postgresql+psycopg://" + url.split("://", 1)[1]
    if "://" not in url:
        raise UsageError(f"--storage {url!r}: expected sqlite:///FILE, postgresql://... or "
                         "journal:///PATH")

    wal = url.startswith("sqlite:///") and _sqlite_wal(url[len("sqlite:///"):])

    def make():
        storage = optuna.storages.get_storage(optuna.storages.RDBStorage(
            url, engine_kwargs={"pool_pre_ping": True}))
        if wal or url.startswith("postgresql"):
            _commit_without_fsync(getattr(storage, "_backend", storage).engine)
        return storage

    try:
        return _retry(make, "opening", retry_s, describe(url))
    except (ValueError, RuntimeError, ImportError) as e:
        raise StorageError(f"storage {describe(url)}: {str(e).splitlines()[0][:200]}") from None


def _sqlite_wal(path: str) -> bool:
    """Put an SQLite study file in write-ahead-log mode (it stays so): readers never block
    the writer, and commits need not wait for the disk (:func:`_commit_without_fsync`).
    SQLite is for one host (WAL needs shared memory, so no network file system). Returns
    whether the file is in WAL mode."""
    import sqlite3

    if not path or path == ":memory:":
        return False
    try:
        con = sqlite3.connect(path, timeout=30)
        try:
            return con.execute("PRAGMA journal_mode=WAL").fetchone()[0].lower() == "wal"
        finally:
            con.close()
    except sqlite3.Error as e:
        log.warning("sqlite %s: WAL mode not set (%s)", path, e)
        return False


def _commit_without_fsync(engine) -> None:
    """Every connection of `engine` commits without waiting for the disk: an SQLite file in
    WAL mode with PRAGMA synchronous=NORMAL (its log synced at each checkpoint), PostgreSQL
    with synchronous_commit=off (the server flushes its log within a fraction of a
    second). A killed worker loses nothing, and the file or database stays whole; a power
    cut, or a crash of the database's machine, loses at most the last commits: a claim
    lost so may be timed twice, a result lost so is timed again once the worker's lease
    runs out. An fsync per commit cost 0.2-4 ms here, and a candidate takes two."""
    import sqlalchemy

    sql = ("PRAGMA synchronous=NORMAL" if engine.dialect.name == "sqlite"
           else "SET synchronous_commit TO off")

    def connected(dbapi_con, record):
        cur = dbapi_con.cursor()
        try:
            cur.execute(sql)
        finally:
            cur.close()
        dbapi_con.commit()

    sqlalchemy.event.listen(engine, "connect", connected)
    engine.dispose()  # the connections opened before the listener


class _FairLock:
    """The journal file's lock: Optuna's symlink lock (works on NFS), polled every 1-10 ms.

    Optuna's own backs off to one poll a second; a process appending in a tight loop
    (an fsync per append) takes the lock back within milliseconds of releasing it, so a
    second process polling once a second can wait for as long as the first keeps writing.
    """

    def __init__(self, path: str, grace_period: float = 30.0):
        from optuna.storages.journal import JournalFileSymlinkLock

        self._lock = JournalFileSymlinkLock(path, grace_period=int(grace_period))
        self._file = self._lock._lock_file
        self.grace_period = grace_period

    def acquire(self) -> bool:
        sleep, seen, since = 0.001, None, time.monotonic()
        while True:
            try:
                os.symlink(self._lock._lock_target_file, self._file)
                return True
            except FileExistsError:
                try:  # a holder that died leaves the link: broken after the grace period
                    mtime = os.lstat(self._file).st_mtime
                except OSError:
                    continue
                if mtime != seen:
                    seen, since = mtime, time.monotonic()
                elif time.monotonic() - since > self.grace_period:
                    log.warning("journal lock %s held for %g s: breaking it", self._file,
                                self.grace_period)
                    try:
                        self._lock.release()
                    except RuntimeError:
                        pass
                time.sleep(sleep)
                sleep = min(sleep * 2, 0.01)

    def release(self) -> None:
        self._lock.release()


@dataclasses.dataclass
class Claim:
    """What the study says of one candidate name."""

    status: str  # done | running | stale | released
    trial: object  # the FrozenTrial deciding it


def _claim_of(t):
    """The candidate a shared trial claims, or None (withdrawn, or no claim)."""
    a = t.user_attrs
    if "duplicate_of" in a:
        return None
    return a.get("claim")


class SharedStudy:
    """One process's side of a shared study: claims, leases, and a cached view.

    `clock` is the local monotonic clock leases are judged by (tests pass a fake one).
    """

    def __init__(self, storage, study_id: int, *, worker: str = WORKER,
                 interval: float = LEASE_INTERVAL, grace: float = LEASE_GRACE,
                 retry_s: float = 60.0, where: str = "", clock=time.monotonic):
        self.storage, self.study_id, self.worker = storage, study_id, worker
        self.interval, self.grace, self.retry_s = interval, grace, retry_s
        self.where = where or describe(storage)
        self.clock = clock
        self._seen_leases: dict[str, tuple[object, float]] = {}  # worker -> (value, since)
        self._leases_read = -1e9
        self._beats = 0
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._trials: list = []  # the last read
        self._claims: dict[str, Claim] | None = None  # worked out from it, once
        self._mine: dict[str, int] = {}  # own claims written since the last read
        self.batch = batched(storage)  # one transaction per claim and per result, or None
        self._writes: "queue.Queue" = queue.Queue()
        self._writer: threading.Thread | None = None
        self._write_error: BaseException | None = None
        self.lost = 0  # own claims another worker failed as stale (we were silent too long)

    # -- storage calls, retried ------------------------------------------------------
    def _call(self, what: str, fn: Callable):
        return _retry(fn, what, self.retry_s, self.where)

    # -- leases -----------------------------------------------------------------------
    def beat(self, value=None) -> None:
        self._beats += 1
        v = value if value is not None else dict(n=self._beats, t=round(time.time(), 3),
                                                 grace=self.grace)
        self._call("renewing the lease", lambda: self.storage.set_study_user_attr(
            self.study_id, f"lease:{self.worker}", v))

    def start(self) -> "SharedStudy":
        """Renew the lease now and then every `interval` seconds, from a thread."""
        self.beat()
        self._stop.clear()
        self._thread = threading.Thread(target=self._beat_loop, name="gemm-tune-lease",
                                        daemon=True)
        self._thread.start()
        return self

    def _beat_loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.beat()
            except Exception as e:  # noqa: BLE001 - keep beating; the main loop reports
                log.warning("lease not renewed: %s", e)

    def stop(self, clean: bool = True) -> None:
        """Stop renewing; a clean stop says so, and others need not wait out the grace."""
        self._stop.set()
        if self._writer is not None:
            self._writes.put(None)
            self._writer.join(self.retry_s + 5)
            self._writer = None
        if self.batch is not None:
            self.batch.close()
        if self._thread is not None:
            self._thread.join(self.interval + 5)
            self._thread = None
        if clean:
            try:
                self.beat(STOPPED)
            except Exception as e:  # noqa: BLE001 - the lease then runs out on its own
                log.warning("could not mark the lease stopped: %s", e)

    def _read_leases(self, force: bool = False) -> None:
        now = self.clock()
        if not force and now - self._leases_read < min(self.interval, self.grace / 4):
            return
        attrs = self._call("reading leases",
                           lambda: self.storage.get_study_user_attrs(self.study_id))
        self._leases_read = now
        self._claims = None
        for key, value in attrs.items():
            if key.startswith("lease:"):
                w = key[len("lease:"):]
                old = self._seen_leases.get(w)
                if old is None or old[0] != value:
                    self._seen_leases[w] = (value, now)

    def alive(self, worker: str | None) -> bool:
        """Has `worker` renewed its lease within the grace period (by this clock)?"""
        if worker == self.worker:
            return True
        seen = self._seen_leases.get(worker)
        if seen is None:  # never seen a lease: count from now
            self._seen_leases[worker] = seen = (None, self.clock())
        if seen[0] == STOPPED:
            return False
        return self.clock() - seen[1] <= self.grace

    # -- the view ---------------------------------------------------------------------
    @property
    def trials(self) -> list:
        """The study's trials as last read."""
        return self._trials

    @trials.setter
    def trials(self, trials: list) -> None:
        self._trials, self._claims = trials, None

    def read(self) -> list:
        """Every trial of the study (the storage caches finished ones), leases, and the
        stale claims failed (released for a retry)."""
        self._read_all()
        self._read_leases()
        if self.reap():
            self._read_all()
        return self.trials

    def _read_all(self) -> None:
        self.trials = self._call("reading the study", lambda: self.storage.get_all_trials(
            self.study_id, deepcopy=False))
        ids = {t._trial_id for t in self.trials}
        self._mine = {n: tid for n, tid in self._mine.items() if tid not in ids}

    def claims(self, trials=None) -> dict[str, Claim]:
        """name -> the strongest claim on it: done > running > stale > released (of the
        last read, worked out once per read, unless `trials` are given)."""
        if trials is not None:
            return self._judge(trials)
        if self._claims is None:
            self._claims = self._judge(self.trials)
        return self._claims

    def _judge(self, trials) -> dict[str, Claim]:
        from optuna.trial import TrialState

        rank = dict(done=3, running=2, stale=1, released=0)
        out: dict[str, Claim] = {}
        for t in trials:
            name = _claim_of(t)
            if name is None:
                continue
            if t.state in (TrialState.COMPLETE, TrialState.PRUNED):
                s = "done"
            elif t.state == TrialState.FAIL:
                s = "done" if t.user_attrs.get("outcome") in FINAL else "released"
            elif t.state == TrialState.RUNNING:
                s = "running" if self.alive(t.user_attrs.get("worker")) else "stale"
            else:
                continue
            if name not in out or rank[s] > rank[out[name].status]:
                out[name] = Claim(s, t)
        return out

    def held(self, trials=None) -> set[str]:
        """Names done or claimed by a live worker (the budget counts these): of `trials`,
        or of the last read and this worker's claims since."""
        names = {n for n, c in self.claims(trials).items() if c.status in ("done", "running")}
        return names if trials is not None else names | set(self._mine)

    def reap(self) -> int:
        """Fail the RUNNING claims of workers whose lease ran out; returns how many."""
        from optuna.trial import TrialState

        n = 0
        for t in self.trials:
            w = t.user_attrs.get("worker")
            if t.state != TrialState.RUNNING or _claim_of(t) is None or self.alive(w):
                continue
            why = self._silent(w)
            # False: finished meanwhile, or another survivor failed it first
            if self._end(t._trial_id, {"reason": why}, TrialState.FAIL,
                         what="failing a stale claim"):
                log.warning("%s: %s", t.user_attrs.get("claim"), why)
                n += 1
        return n

    def _silent(self, worker: str | None) -> str:
        """The reason a claim of `worker`, gone silent, is failed."""
        return (f"released: worker {worker} stopped renewing its lease (silent over "
                f"{self.grace:g} s); retried by the others")

    def others_running(self) -> bool:
        """Does a live worker other than this one hold a RUNNING claim?"""
        return any(c.status == "running" and c.trial.user_attrs.get("worker") != self.worker
                   for c in self.claims().values())

    def released(self) -> list:
        """Released candidates no one holds now: the FrozenTrials to retry."""
        return [c.trial for c in self.claims().values() if c.status == "released"]

    # -- claims -----------------------------------------------------------------------
    def claim(self, name: str, params: dict, distributions: dict, attrs: dict,
              budget: int | None) -> tuple[int | None, str | None]:
        """Claim `name`: (its trial id, None) if the claim stands, else (None, why) as
        :meth:`confirm` says. One transaction where the storage allows it (the study's
        claims are read inside it, so the view is not read again), else :meth:`propose`
        and :meth:`confirm`."""
        if self.batch is None:
            tid = self.propose(name, params, distributions, attrs)
            why = self.confirm(tid, name, budget)
            return (None, why) if why else (tid, None)
        self._read_leases()
        attrs = dict(attrs, claim=name, kernel=name, worker=self.worker)
        tid, why, released = self._call("claiming a candidate", lambda: self.batch.claim(
            self.study_id, params, distributions, attrs,
            lambda tid, rows: (self._withdrawal(rows, tid, name, budget),
                               self._stale(rows, tid))))
        for old, reason in released.items():
            log.warning("claim %d: %s", old, reason)
        if why is not None:
            return None, why
        self._mine[name] = tid
        return tid, None

    def _stale(self, trials, trial_id: int) -> dict[int, str]:
        """The RUNNING claims of workers gone silent (other than `trial_id`), each with the
        reason it is failed: a claim judges the name and the budget without them, so it
        fails them in the same commit, as :meth:`confirm`'s read reaps them first."""
        from optuna.trial import TrialState

        return {t._trial_id: self._silent(t.user_attrs.get("worker")) for t in trials
                if t._trial_id != trial_id and t.state == TrialState.RUNNING
                and _claim_of(t) is not None and not self.alive(t.user_attrs.get("worker"))}

    def _withdrawal(self, trials, trial_id: int, name: str, budget: int | None) -> str | None:
        """Why the claim `trial_id` on `name` gives way, judged on `trials` (the study,
        that claim in it): "held" (another live claim, or a result), "full" (more than
        `budget` names held), or None."""
        from optuna.trial import TrialState

        for t in trials:
            if t._trial_id != trial_id and _claim_of(t) == name and (
                    t.state in (TrialState.COMPLETE, TrialState.PRUNED)
                    or (t.state == TrialState.FAIL and t.user_attrs.get("outcome") in FINAL)
                    or (t.state == TrialState.RUNNING and self.alive(t.user_attrs.get("worker")))):
                return "held"
        if budget is not None and len(self.held(trials)) > budget:
            return "full"
        return None

    def propose(self, name: str, params: dict, distributions: dict, attrs: dict) -> int:
        """Write a claim on `name` (one write); returns its trial id."""
        import optuna
        from optuna.trial import TrialState

        template = optuna.trial.FrozenTrial(
            number=-1, state=TrialState.RUNNING, value=None, values=None,
            datetime_start=None, datetime_complete=None, params=params,
            distributions=distributions, intermediate_values={}, system_attrs={},
            trial_id=-1,
            user_attrs=dict(attrs, claim=name, kernel=name, worker=self.worker))
        template.datetime_start = _now()
        return self._call("claiming a candidate", lambda: self.storage.create_new_trial(
            self.study_id, template_trial=template))

    def confirm(self, trial_id: int, name: str, budget: int | None) -> str | None:
        """After `propose`: read the study; None if the claim stands, else why it was
        withdrawn ("held": another live claim; "full": the study holds the budget)."""
        import optuna
        from optuna.trial import TrialState

        self.read()
        why = self._withdrawal(self.trials, trial_id, name, budget)
        if why:
            reason = ("claimed by another worker of this study" if why == "held" else
                      "the study already holds its budget of candidates")
            try:
                self._call("withdrawing a claim", lambda: (
                    self.storage.set_trial_user_attr(trial_id, "duplicate_of", name),
                    self.storage.set_trial_user_attr(trial_id, "reason", reason),
                    self.storage.set_trial_state_values(trial_id, TrialState.PRUNED)))
            except optuna.exceptions.UpdateFinishedTrialError:
                pass  # another worker failed it already (released): it is withdrawn either way
        return why

    def finish_later(self, trial_id: int, attrs: dict, state, value: float | None = None):
        """`finish` from a writer thread, so the search does not wait for the commits;
        `flush` waits for every one (and raises a StorageError one of them met)."""
        if self._write_error is not None:
            raise self._write_error
        if self._writer is None:
            self._writer = threading.Thread(target=self._write_loop, name="gemm-tune-writes",
                                            daemon=True)
            self._writer.start()
        self._writes.put((trial_id, attrs, state, value))

    def _write_loop(self) -> None:
        """The writer thread: whatever has queued up since its last write, in one
        transaction where the storage allows it (else one by one)."""
        while True:
            jobs = [self._writes.get()]
            while jobs[-1] is not None and not self._writes.empty():
                jobs.append(self._writes.get())
            try:
                ends = [job for job in jobs if job is not None]
                if ends and self._write_error is None:
                    self._finish_all(ends)
            except BaseException as e:  # noqa: BLE001 - raised again by flush
                self._write_error = e
            finally:
                for _ in jobs:
                    self._writes.task_done()
            if jobs[-1] is None:
                return

    def _finish_all(self, ends: list[tuple]) -> None:
        if self.batch is None:
            for end in ends:
                self.finish(*end)
            return
        done = self._call("recording results", lambda: self.batch.end_all(ends))
        for (trial_id, *_), ok in zip(ends, done):
            if not ok:
                self._lost(trial_id)

    def flush(self) -> None:
        if self._writer is not None:
            self._writes.join()
        if self._write_error is not None:
            e, self._write_error = self._write_error, None
            raise e

    def finish(self, trial_id: int, attrs: dict, state, value: float | None = None) -> bool:
        """Record an own claim's end; False if another worker had failed it as stale."""
        if self._end(trial_id, attrs, state, value):
            return True
        self._lost(trial_id)
        return False

    def _lost(self, trial_id: int) -> None:
        self.lost += 1
        log.warning("claim %d was released by another worker before it finished: its result "
                    "is dropped, the study keeps the retry's", trial_id)

    def _end(self, trial_id: int, attrs: dict, state, value: float | None = None,
             what: str = "recording a result") -> bool:
        """End a RUNNING trial with `attrs`, `state` and `value` (one transaction where
        the storage allows it); False if it was no longer RUNNING."""
        import optuna

        if self.batch is not None:
            return self._call(what, lambda: self.batch.end(trial_id, attrs, state, value))
        try:
            self._call(what, lambda: (
                [self.storage.set_trial_user_attr(trial_id, k, v) for k, v in attrs.items()],
                self.storage.set_trial_state_values(
                    trial_id, state, None if value is None else [value])))
            return True
        except (optuna.exceptions.UpdateFinishedTrialError, RuntimeError):
            return False


def _now():
    import datetime

    return datetime.datetime.now()


def study_state(storage, study_name: str | None = None, grace: float | None = None) -> list[dict]:
    """What `gemm-tune status` shows: per study, its candidates done / running / stale /
    released, and its workers with the age of their lease.

    Staleness here is judged by the wall clock (the lease's own time stamp against this
    machine's), so hosts' clocks should roughly agree; a search itself judges leases by
    watching them change on its own clock, which needs no agreement.
    """
    import optuna

    out = []
    summaries = optuna.study.get_all_study_summaries(storage, include_best_trial=False)
    for s in summaries:
        if study_name is not None and s.study_name != study_name:
            continue
        sid = storage.get_study_id_from_name(s.study_name)
        attrs = storage.get_study_user_attrs(sid)
        now = time.time()
        workers = {}
        for key, v in attrs.items():
            if key.startswith("lease:"):
                w = key[len("lease:"):]
                if v == STOPPED:
                    workers[w] = dict(state="stopped", age_s=None)
                else:
                    age = now - float(v.get("t", 0))
                    g = grace or float(v.get("grace", LEASE_GRACE))
                    workers[w] = dict(state="alive" if age <= g else "silent",
                                      age_s=round(age, 1), grace_s=g)
        view = SharedStudy(storage, sid, worker="status", grace=0.0, clock=lambda: 0.0)
        view.trials = storage.get_all_trials(sid, deepcopy=False)
        view._seen_leases = {w: ("x", 0.0 if d["state"] == "alive" else -1.0)
                             for w, d in workers.items()}
        counts = dict(done=0, running=0, stale=0, released=0)
        best = None
        for c in view.claims().values():
            counts[c.status] += 1
            if c.trial.value is not None and c.status == "done":
                if best is None or c.trial.value > best[1]:
                    best = (c.trial.user_attrs.get("kernel"), c.trial.value)
        out.append(dict(study=s.study_name, trials=len(view.trials), **counts,
                        timed=sum(c.trial.user_attrs.get("outcome") == "timed"
                                  for c in view.claims().values()),
                        best=dict(kernel=best[0], tflops=round(best[1], 2)) if best else None,
                        workers=workers))
    if study_name is not None and not out:
        raise UsageError(f"no study {study_name!r} in {describe(storage)}")
    return out

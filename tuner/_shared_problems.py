"""A program's recorded problems shared by workers (processes, GPUs, hosts) through
``--storage``: each worker takes problems no one else holds.

The set's claims live in one study of the storage (``--study``, default
:data:`DEFAULT_STUDY`), with the claims and leases of tuner._study: a worker claims a
problem under its cache key (GPU, CUDA, templates, input type, variant, batch, shape; so
a problem on another GPU model is another claim) before it tunes it, and ends the claim
with its summary row (the winner, its ratio to cuBLAS, the seconds spent). A worker that
stops renewing its lease (killed, host lost) has its claim failed by the others once
``--lease`` seconds have passed, and the problem is tuned again by one of them or by the
next run. Each problem's own search is a study of its own (named by its cache key), so a
retried problem keeps the candidates already timed.
"""

from __future__ import annotations

import logging
import time

from tuner._study import SharedStudy, _retry, describe, open_storage

__all__ = ["DEFAULT_STUDY", "SharedProblems"]

log = logging.getLogger(__name__)

#: the study of a problem set's claims, unless --study names another
DEFAULT_STUDY = "problems"


class SharedProblems:
    """One worker's side of a shared problem set: what the others hold or finished, and
    its own claims. `lease` is (interval, grace) in seconds, as for a search."""

    def __init__(self, storage: str, study_name: str, lease: tuple[float, float],
                 retry_s: float = 60.0):
        import optuna

        where = describe(storage)
        self.storage = open_storage(storage, retry_s)
        study = _retry(lambda: optuna.create_study(
            direction="maximize", storage=self.storage, study_name=study_name,
            load_if_exists=True), "opening the problems' study", retry_s, where)
        self.shared = SharedStudy(self.storage, study._study_id, interval=lease[0],
                                  grace=lease[1], retry_s=retry_s, where=where).start()
        self.mine: dict[str, int] = {}  # key -> trial id of a claim this worker holds

    @property
    def worker(self) -> str:
        return self.shared.worker

    def read(self) -> None:
        """Read the study again (and fail the claims of workers gone silent)."""
        self.shared.read()

    def status(self, key: str) -> tuple[str, dict | None]:
        """("done", its summary row and worker), ("held", {"worker": who}) while a live
        worker holds it, or ("free", None): as of the last read."""
        c = self.shared.claims().get(key)
        if c is None or c.status in ("released", "stale"):
            return "free", None
        who = c.trial.user_attrs.get("worker")
        if c.status == "done":
            return "done", dict(c.trial.user_attrs.get("row") or {}, worker=who)
        return "held", {"worker": who}

    def claim(self, key: str, label: str) -> bool:
        """Claim the problem `key` (`label` is for people); False if another holds it."""
        tid, why = self.shared.claim(key, {}, {}, {"problem": label}, None)
        if why is None:
            self.mine[key] = tid
        return why is None

    def done(self, key: str, row: dict) -> None:
        """End this worker's claim on `key` with the problem's summary row."""
        from optuna.trial import TrialState

        self.shared.finish(self.mine.pop(key), {"outcome": "tuned", "row": row},
                           TrialState.COMPLETE, row.get("ratio"))

    def release(self, key: str, reason: str) -> None:
        """End this worker's claim on `key` unfinished: another worker, or the next run,
        takes the problem up."""
        from optuna.trial import TrialState

        self.shared.finish(self.mine.pop(key), {"reason": reason}, TrialState.FAIL)

    def wait(self) -> None:
        """A while (a quarter of the lease interval, at most a second), then read again."""
        time.sleep(min(max(self.shared.interval / 4, 0.05), 1.0))
        self.read()

    def close(self) -> None:
        """Release what this worker still holds and stop renewing its lease."""
        try:
            for key in list(self.mine):
                self.release(key, "the worker stopped before it finished")
        finally:
            self.shared.stop(clean=True)

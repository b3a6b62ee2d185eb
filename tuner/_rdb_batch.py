"""A shared study's claims and results in one transaction each, on an Optuna RDB storage
(SQLite or PostgreSQL).

Optuna's RDBStorage commits every call on its own and checks as it goes: a claim through
``create_new_trial`` is about 45 statements (each parameter's distribution looked up
against the study, the trial looked up again per parameter and attribute), and a result
is one commit per attribute and one for the state. Here a claim is one transaction of
five statements (the trial, its parameters, its attributes, then the study's claims read
back inside it, and rolled back when another holds the name or the budget is full), and
a result one of three (the state changed only if the trial is still RUNNING, its value,
its attributes). The claims are read incrementally: a finished trial never changes, so
each claim reads only the unfinished trials and those above the highest finished one
seen, as Optuna's cached storage reads its trials.

The rows are Optuna's own: written through its table definitions
(``optuna.storages._rdb.models``, a private module), so this is used only where the
storage's schema is the revision it was written for, :data:`SCHEMA` (Optuna 3.2 to 5.0),
on SQLite or PostgreSQL; :func:`batched` returns None anywhere else, and the caller goes
through Optuna's public storage API instead. Optuna's cached storage reads unfinished
trials and those with a higher id again on every read, so it sees these rows as if it
had written them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import logging
import sqlite3
import threading
from typing import Callable

__all__ = ["SCHEMA", "ClaimRow", "BatchedWrites", "batched"]

log = logging.getLogger(__name__)

#: the Optuna RDB schema revision (alembic) these statements were written for
SCHEMA = "v3.2.0.a"
#: the user attributes a claim is judged by
CLAIM_KEYS = ("claim", "worker", "outcome", "duplicate_of")


@dataclasses.dataclass
class ClaimRow:
    """One trial of the study as a claim is judged: the FrozenTrial fields it reads."""

    _trial_id: int
    state: object  # optuna.trial.TrialState
    user_attrs: dict


@dataclasses.dataclass
class _Seen:
    """One study's claim rows as read so far (trial id -> row): the unfinished ones are
    read again, and the trials above `last`, the highest finished id seen."""

    rows: dict = dataclasses.field(default_factory=dict)
    unfinished: set = dataclasses.field(default_factory=set)
    last: int = -1

    def take(self, fresh: dict) -> None:
        for tid, row in fresh.items():
            self.rows[tid] = row
            if row.state.is_finished():
                self.unfinished.discard(tid)
                self.last = max(self.last, tid)
            else:
                self.unfinished.add(tid)

    def forget(self, tid: int) -> None:
        """A trial of a transaction rolled back."""
        self.rows.pop(tid, None)
        self.unfinished.discard(tid)


def batched(storage) -> "BatchedWrites | None":
    """One-transaction writes for `storage` (an Optuna RDBStorage, or the cached storage
    around one) if it is SQLite or PostgreSQL at schema :data:`SCHEMA`; else None."""
    from optuna.storages import RDBStorage

    backend = getattr(storage, "_backend", storage)
    if not isinstance(backend, RDBStorage):
        return None
    engine = getattr(backend, "engine", None)
    if engine is None or engine.dialect.name not in ("sqlite", "postgresql"):
        return None
    if engine.dialect.name == "sqlite" and sqlite3.sqlite_version_info < (3, 24, 0):
        return None  # no upsert (INSERT ... ON CONFLICT)
    try:
        from optuna.storages._rdb import models

        version = backend.get_current_version()
    except Exception as e:  # noqa: BLE001 - any doubt: Optuna's own calls instead
        log.debug("one-transaction writes off: %s", e)
        return None
    if version != SCHEMA:
        log.info("storage schema %s (not %s): claims go through Optuna's calls", version,
                 SCHEMA)
        return None
    return BatchedWrites(engine, models)


def _stored(model, column: str, value):
    """`value` as `model` stores it in `column` (Optuna 5 keeps trial times in UTC,
    Optuna 4 in local time; each model's own attribute converts)."""
    prop = model.__mapper__.get_property_by_column(model.__table__.c[column])
    return getattr(model(**{column: value}), prop.key)


def _param_rows(trial_id: int, params: dict, distributions: dict) -> list[dict]:
    """The trial_params rows of one trial's `params`, as Optuna stores them."""
    from optuna.distributions import distribution_to_json

    return [dict(trial_id=trial_id, param_name=k,
                 param_value=distributions[k].to_internal_repr(v),
                 distribution_json=distribution_to_json(distributions[k]))
            for k, v in params.items()]


class BatchedWrites:
    """Claims and results of one storage's studies, one transaction each."""

    def __init__(self, engine, models):
        self.engine, self.m = engine, models
        self.T = models.TrialModel.__table__
        self.locks = engine.dialect.name != "sqlite"  # SQLite: one writer at a time anyway
        self.dists: dict[int, dict] = {}  # study id -> parameter -> distribution, checked
        self.seen: dict[int, _Seen] = {}  # study id -> its claim rows read so far
        self.local = threading.local()  # each thread's connection, kept between transactions
        self.kept: list = []

    @contextlib.contextmanager
    def connection(self):
        """This thread's connection (kept: no pool check-out, ping and reset a
        transaction), rolled back and dropped if anything fails inside."""
        c = getattr(self.local, "c", None)
        if c is None or c.closed or c.invalidated:
            c = self.local.c = self.engine.connect()
            self.kept.append(c)
        try:
            yield c
        except BaseException:
            self.local.c = None
            with contextlib.suppress(Exception):
                c.close()  # rolls back; a broken one is discarded
            raise

    def close(self) -> None:
        """Return the kept connections to the pool."""
        for c in self.kept:
            with contextlib.suppress(Exception):
                c.close()
        self.kept.clear()

    def claim(self, study_id: int, params: dict, distributions: dict, attrs: dict,
              verdict: Callable[[int, list[ClaimRow]], tuple[str | None, dict]]
              ) -> tuple[int, str | None, dict]:
        """Write a RUNNING trial with `params` and the user attributes `attrs`, read the
        study's claims (this one among them) and ask `verdict(trial id, rows)` for
        (reason, released): a reason not to claim rolls everything back (nothing is
        written); else the trials in `released` (id -> why: claims of workers gone silent,
        which the verdict did not count) are failed with their reasons and all is
        committed.
        Returns (trial id, reason, the trials failed)."""
        from optuna.trial import TrialState
        from sqlalchemy import func, insert, select

        T = self.T
        with self.connection() as c:
            if self.locks:  # trial numbers are counted: one claim at a time, as Optuna does
                S = self.m.StudyModel.__table__
                c.execute(select(S.c.study_id).where(S.c.study_id == study_id).with_for_update())
            self.check(c, study_id, distributions)
            # its number: the study's trials before it (all of them, under the lock)
            number = select(func.count()).select_from(T).where(
                T.c.study_id == study_id).scalar_subquery()
            tid = c.execute(insert(T).values(
                study_id=study_id, number=number, state=TrialState.RUNNING,
                datetime_start=_stored(self.m.TrialModel, "datetime_start",
                                       datetime.datetime.now()))).inserted_primary_key[0]
            seen = self.seen.setdefault(study_id, _Seen())
            try:
                self.insert_params(c, tid, params, distributions)
                self.upsert_attrs(c, tid, attrs)
                why, released = verdict(tid, self.claim_rows(c, study_id))
                if why is None:
                    released = {old: reason for old, reason in released.items()
                                if self.end_in(c, old, {"reason": reason}, TrialState.FAIL)}
                    c.commit()
                    self.dists.setdefault(study_id, {}).update(distributions)
                    return tid, None, released
            except BaseException:
                # did it commit? (a connection lost in COMMIT cannot say): read all again
                self.seen.pop(study_id, None)
                raise
            c.rollback()
            seen.forget(tid)  # read inside a transaction that did not commit
        return tid, why, {}

    def end(self, trial_id: int, attrs: dict, state, value: float | None = None) -> bool:
        """Finish a RUNNING trial: its state, `value` and user attributes `attrs`; False
        (nothing written) if it is no longer RUNNING (another worker failed it)."""
        return self.end_all([(trial_id, attrs, state, value)])[0]

    def end_all(self, ends: list[tuple]) -> list[bool]:
        """:meth:`end` for each (trial id, attrs, state, value) of `ends`, in one
        transaction; for each, whether it was still RUNNING (if not, nothing of it is
        written)."""
        with self.connection() as c:
            done = [self.end_in(c, *end) for end in ends]
            c.commit()
        return done

    def copy_trials(self, study_id: int, trials: list) -> None:
        """Write `trials` (Optuna FrozenTrials, finished or not) into the study `study_id`
        as its trials numbered from 0, in one transaction: a statement per trial (its id)
        and one for each table of its rows. optuna.copy_study takes about 40 statements and
        a commit per trial (10 s for 600 trials on a CI core)."""
        from sqlalchemy import insert

        m = self.m
        rows: dict = {m.TrialParamModel: [], m.TrialValueModel: [],
                      m.TrialUserAttributeModel: [], m.TrialSystemAttributeModel: [],
                      m.TrialIntermediateValueModel: []}
        with self.connection() as c:
            for number, t in enumerate(trials):
                tid = c.execute(insert(self.T).values(
                    study_id=study_id, number=number, state=t.state,
                    datetime_start=_stored(m.TrialModel, "datetime_start", t.datetime_start),
                    datetime_complete=_stored(m.TrialModel, "datetime_complete",
                                              t.datetime_complete))).inserted_primary_key[0]
                rows[m.TrialParamModel] += _param_rows(tid, t.params, t.distributions)
                for i, v in enumerate(t.values or ()):
                    stored, kind = m.TrialValueModel.value_to_stored_repr(v)
                    rows[m.TrialValueModel].append(
                        dict(trial_id=tid, objective=i, value=stored, value_type=kind))
                for model, attrs in ((m.TrialUserAttributeModel, t.user_attrs),
                                     (m.TrialSystemAttributeModel, t.system_attrs)):
                    rows[model] += [dict(trial_id=tid, key=k, value_json=json.dumps(v))
                                    for k, v in attrs.items()]
                for step, v in t.intermediate_values.items():
                    stored, kind = m.TrialIntermediateValueModel.\
                        intermediate_value_to_stored_repr(v)
                    rows[m.TrialIntermediateValueModel].append(
                        dict(trial_id=tid, step=step, intermediate_value=stored,
                             intermediate_value_type=kind))
            for model, values in rows.items():
                if values:
                    c.execute(insert(model.__table__), values)
            c.commit()

    # -- the statements --------------------------------------------------------------
    def end_in(self, c, trial_id: int, attrs: dict, state, value: float | None = None) -> bool:
        """:meth:`end`'s statements on the connection `c` (not committed)."""
        from optuna.trial import TrialState
        from sqlalchemy import insert, update

        T, m = self.T, self.m
        done = c.execute(update(T).where(
            T.c.trial_id == trial_id, T.c.state == TrialState.RUNNING).values(
            state=state, datetime_complete=_stored(
                m.TrialModel, "datetime_complete", datetime.datetime.now())))
        if done.rowcount != 1:
            return False
        if value is not None:
            stored, kind = m.TrialValueModel.value_to_stored_repr(value)
            c.execute(insert(m.TrialValueModel.__table__).values(
                trial_id=trial_id, objective=0, value=stored, value_type=kind))
        self.upsert_attrs(c, trial_id, attrs)
        return True

    def check(self, c, study_id: int, distributions: dict) -> None:
        """Each parameter's distribution against the study's (ValueError if they differ),
        as Optuna checks them; the study's are read once."""
        from optuna.distributions import check_distribution_compatibility, json_to_distribution
        from sqlalchemy import select

        known = self.dists.get(study_id)
        if known is None:
            P, T = self.m.TrialParamModel.__table__, self.T
            rows = c.execute(select(P.c.param_name, P.c.distribution_json).join(
                T, T.c.trial_id == P.c.trial_id).where(T.c.study_id == study_id).distinct())
            known = self.dists[study_id] = {n: json_to_distribution(d) for n, d in rows}
        for name, dist in distributions.items():
            if name in known:
                check_distribution_compatibility(known[name], dist)

    def insert_params(self, c, trial_id: int, params: dict, distributions: dict) -> None:
        from sqlalchemy import insert

        if params:
            c.execute(insert(self.m.TrialParamModel.__table__),
                      _param_rows(trial_id, params, distributions))

    def upsert_attrs(self, c, trial_id: int, attrs: dict) -> None:
        """The user attributes `attrs`, replacing those of the same keys (one statement)."""
        if not attrs:
            return
        if self.engine.dialect.name == "sqlite":
            from sqlalchemy.dialects.sqlite import insert
        else:
            from sqlalchemy.dialects.postgresql import insert
        A = self.m.TrialUserAttributeModel.__table__
        stmt = insert(A).values([dict(trial_id=trial_id, key=k, value_json=json.dumps(v))
                                 for k, v in attrs.items()])
        c.execute(stmt.on_conflict_do_update(index_elements=[A.c.trial_id, A.c.key],
                                             set_=dict(value_json=stmt.excluded.value_json)))

    def claim_rows(self, c, study_id: int) -> list[ClaimRow]:
        """Every trial of the study with a claim, with the attributes claims are judged by:
        those read before and finished since, and the rest read now."""
        from sqlalchemy import or_, select

        T, A = self.T, self.m.TrialUserAttributeModel.__table__
        seen = self.seen[study_id]
        which = T.c.trial_id > seen.last
        if seen.unfinished:
            which = or_(which, T.c.trial_id.in_(sorted(seen.unfinished)))
        fresh: dict[int, ClaimRow] = {}
        for tid, state, key, value in c.execute(select(
                T.c.trial_id, T.c.state, A.c.key, A.c.value_json).join(
                A, A.c.trial_id == T.c.trial_id).where(
                T.c.study_id == study_id, A.c.key.in_(CLAIM_KEYS), which)):
            fresh.setdefault(tid, ClaimRow(tid, state, {})).user_attrs[key] = json.loads(value)
        seen.take(fresh)
        return [r for r in seen.rows.values() if "claim" in r.user_attrs]

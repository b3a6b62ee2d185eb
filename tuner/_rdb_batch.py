"""A shared study's claims and results in one transaction each, on an Optuna RDB storage
(SQLite or PostgreSQL).

Optuna's RDBStorage commits every call on its own and checks as it goes: a claim through
``create_new_trial`` is about 45 statements (each parameter's distribution looked up
against the study, the trial looked up again per parameter and attribute), and a result
is one commit per attribute and one for the state. Here a claim is one transaction (the
trial, its parameters and attributes, then the study's claims read back inside it, and
rolled back when another holds the name or the budget is full), and a result is one
transaction (the state changed only if the trial is still RUNNING, its value, its
attributes).

The rows are Optuna's own: written through its table definitions
(``optuna.storages._rdb.models``, a private module), so this is used only where the
storage's schema is the revision it was written for, :data:`SCHEMA` (Optuna 3.2 to 5.0),
on SQLite or PostgreSQL; :func:`batched` returns None anywhere else, and the caller goes
through Optuna's public storage API instead. Optuna's cached storage reads unfinished
trials and those with a higher id again on every read, so it sees these rows as if it
had written them.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
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


class BatchedWrites:
    """Claims and results of one storage's studies, one transaction each."""

    def __init__(self, engine, models):
        self.engine, self.m = engine, models
        self.T = models.TrialModel.__table__
        self.locks = engine.dialect.name != "sqlite"  # SQLite: one writer at a time anyway
        self.dists: dict[int, dict] = {}  # study id -> parameter -> distribution, checked

    def claim(self, study_id: int, params: dict, distributions: dict, attrs: dict,
              verdict: Callable[[int, list[ClaimRow]], str | None]) -> tuple[int, str | None]:
        """Write a RUNNING trial with `params` and the user attributes `attrs`, read the
        study's claims (this one among them) and commit unless `verdict(trial id, rows)`
        names a reason not to (then roll back: nothing is written). Returns (trial id,
        reason)."""
        from optuna.trial import TrialState
        from sqlalchemy import func, insert, select

        T = self.T
        with self.engine.connect() as c:
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
            self.insert_params(c, tid, params, distributions)
            self.insert_attrs(c, tid, attrs)
            why = verdict(tid, self.claim_rows(c, study_id))
            if why is None:
                c.commit()
                self.dists.setdefault(study_id, {}).update(distributions)
            else:
                c.rollback()
        return tid, why

    def end(self, trial_id: int, attrs: dict, state, value: float | None = None) -> bool:
        """Finish a RUNNING trial: its state, `value` and user attributes `attrs`; False
        (nothing written) if it is no longer RUNNING (another worker failed it)."""
        from optuna.trial import TrialState
        from sqlalchemy import delete, insert, update

        T, m = self.T, self.m
        with self.engine.connect() as c:
            done = c.execute(update(T).where(
                T.c.trial_id == trial_id, T.c.state == TrialState.RUNNING).values(
                state=state, datetime_complete=_stored(
                    m.TrialModel, "datetime_complete", datetime.datetime.now())))
            if done.rowcount != 1:
                c.rollback()
                return False
            if value is not None:
                stored, kind = m.TrialValueModel.value_to_stored_repr(value)
                c.execute(insert(m.TrialValueModel.__table__).values(
                    trial_id=trial_id, objective=0, value=stored, value_type=kind))
            if attrs:  # new values for keys it had, the others added
                A = self.m.TrialUserAttributeModel.__table__
                c.execute(delete(A).where(A.c.trial_id == trial_id, A.c.key.in_(list(attrs))))
            self.insert_attrs(c, trial_id, attrs)
            c.commit()
        return True

    # -- the statements --------------------------------------------------------------
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
        from optuna.distributions import distribution_to_json
        from sqlalchemy import insert

        if params:
            c.execute(insert(self.m.TrialParamModel.__table__), [
                dict(trial_id=trial_id, param_name=k,
                     param_value=distributions[k].to_internal_repr(v),
                     distribution_json=distribution_to_json(distributions[k]))
                for k, v in params.items()])

    def insert_attrs(self, c, trial_id: int, attrs: dict) -> None:
        from sqlalchemy import insert

        if attrs:
            c.execute(insert(self.m.TrialUserAttributeModel.__table__), [
                dict(trial_id=trial_id, key=k, value_json=json.dumps(v))
                for k, v in attrs.items()])

    def claim_rows(self, c, study_id: int) -> list[ClaimRow]:
        """Every trial of the study with a claim, with the attributes claims are judged by."""
        from sqlalchemy import select

        T, A = self.T, self.m.TrialUserAttributeModel.__table__
        rows: dict[int, ClaimRow] = {}
        for tid, state, key, value in c.execute(select(
                T.c.trial_id, T.c.state, A.c.key, A.c.value_json).join(
                A, A.c.trial_id == T.c.trial_id).where(
                T.c.study_id == study_id, A.c.key.in_(CLAIM_KEYS))):
            rows.setdefault(tid, ClaimRow(tid, state, {})).user_attrs[key] = json.loads(value)
        return [r for r in rows.values() if "claim" in r.user_attrs]

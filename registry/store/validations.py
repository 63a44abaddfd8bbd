"""Persistence of validation runs and their check results, over the Store's one session scope.

A run is written as ``running`` (with the validating process's host, pid and start time) before
the first check, each check as it finishes, and the end (passed/failed + the pair's state move +
its audit event) in one transaction. A run interrupted by Ctrl-C or SIGTERM is marked ``aborted``
by the process itself (specreg/runtime_validation.py). A run whose process was killed outright
(SIGKILL, power loss) cannot say so: every later read of runs (``show``, ``validate``, the gate's
reasons) first has ``reap_dead_runs`` mark a ``running`` run of this host whose process is gone (or
whose pid another process took since) ``abandoned``, naming that process. A run of another host
(a shared PostgreSQL) is left to that host, and ``show`` names its host and pid. Aborted,
abandoned and errored runs never move the pair's state.
"""

from __future__ import annotations

import json
import os
import socket
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from specreg.core.baselines import in_engine_terms
from specreg.core.digests import canonical_json, sha256_hex
from specreg.core.statuses import FINISHED_RUNS, CheckStatus, RunStatus
from specreg.registry.store.entities import AuditEvent, PairState, PairVersion, ValidationRun
from specreg.registry.store.orm import CheckResultRow, PairRow, PairVersionRow, ValidationRunRow
from specreg.registry.store.store import Store, utcnow, verified_chain

# the names this store's callers write; they are the RunStatus members themselves
RUNNING, PASSED, FAILED, ABORTED, ABANDONED, ERROR = (RunStatus.RUNNING, RunStatus.PASSED, RunStatus.FAILED,
                                                      RunStatus.ABORTED, RunStatus.ABANDONED, RunStatus.ERROR)


def run_content_sha256(row: ValidationRunRow) -> str:
    """The hash of what a finished run says (its verdict, what it ran on, its figures and every
    check result), recorded in the run's ``validate`` audit event: a run, or a check row, written
    or edited outside that event counts for nothing. Hashed as the database gives it back (JSON
    round trip: tuples become lists, integer keys strings)."""
    return sha256_hex(canonical_json(json.loads(json.dumps({
        "id": row.id, "pair_version_id": row.pair_version_id, "status": row.status, "golden_set": row.golden_set,
        "golden_sha256": row.golden_sha256, "binding_sha256": row.binding_sha256, "summary": row.summary,
        "baselines": row.baselines, "finished_at": row.finished_at.isoformat(timespec="microseconds")
        if row.finished_at else None,
        "checks": [{"name": c.name, "status": c.status, "summary": c.summary, "evidence": c.evidence,
                    "figures": c.figures} for c in sorted(row.checks, key=lambda c: c.id)],
    }))))


def chained_run_ids(session: Session, chain: list[AuditEvent]) -> set[int]:
    """The ids of the finished runs whose content the verified audit chain vouches for: a
    ``validate`` event names the run and its content hash, and the run still hashes to it."""
    covered: dict[int, str] = {}
    for event in chain:
        details = event.details or {}
        if event.action == "validate" and isinstance(details.get("validation_run_id"), int):
            covered[details["validation_run_id"]] = str(details.get("run_sha256"))
    if not covered:
        return set()
    rows = session.scalars(select(ValidationRunRow).where(ValidationRunRow.id.in_(list(covered))))
    return {row.id for row in rows if row.status in FINISHED_RUNS and run_content_sha256(row) == covered[row.id]}


def uncovered_runs(session: Session, chain: list[AuditEvent]) -> list[str]:
    """One line per finished run that counts for nothing because no audit event covers it."""
    covered = chained_run_ids(session, chain)
    found = session.execute(select(ValidationRunRow.id, ValidationRunRow.status, PairRow.name, PairVersionRow.version)
                            .join(PairVersionRow, ValidationRunRow.pair_version_id == PairVersionRow.id)
                            .join(PairRow, PairVersionRow.pair_id == PairRow.id)
                            .where(ValidationRunRow.status.in_(FINISHED_RUNS)).order_by(ValidationRunRow.id)).all()
    return [f"validation run {run_id} of {name}@{version} ({status}): no audit event covers its content "
            f"(written or edited outside specreg validate, or before schema 0007): it counts for nothing"
            for run_id, status, name, version in found if run_id not in covered]


def counted_finished_runs(session: Session, version: PairVersion, chain: list[AuditEvent]) -> list[ValidationRun]:
    """The passed or failed runs of ``version``, newest first, whose content an audit event of the
    verified ``chain`` covers (a row written or edited outside `specreg validate` judged nothing)."""
    counted = chained_run_ids(session, chain)
    rows = session.scalars(select(ValidationRunRow).where(ValidationRunRow.pair_version_id == version.id,
                                                          ValidationRunRow.status.in_(FINISHED_RUNS))
                           .order_by(ValidationRunRow.id.desc()))
    return [row.to_entity(version.name, version.version) for row in rows if row.id in counted]


def process_start_ticks(pid: int) -> int | None:
    """The start time of process ``pid`` in clock ticks since boot (Linux), to tell a live
    validating process from a later one that reused its pid; None where /proc is absent."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            # the command name (field 2) may hold spaces: split after its closing parenthesis
            return int(handle.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def process_identity() -> dict[str, Any]:
    """What identifies this process for ``reap_dead_runs``: host, pid, start ticks."""
    pid = os.getpid()
    return {"hostname": socket.gethostname(), "pid": pid, "pid_start_ticks": process_start_ticks(pid)}


def process_alive(pid: int, start_ticks: int | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    if start_ticks is not None:
        now = process_start_ticks(pid)
        if now is not None and now != start_ticks:
            return False  # the pid was reused by another process
        if _is_zombie(pid):
            return False
    return True


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


class ValidationStore:
    """Validation runs of pair versions in one registry database."""

    def __init__(self, store: Store):
        self.store = store

    def start(self, pair_version: PairVersion, *, golden_set: str, golden_sha256: str,
              environment: dict[str, Any], options: dict[str, Any], actor: str) -> ValidationRun:
        """Insert a ``running`` run for ``pair_version`` owned by this process -> the run."""
        identity = process_identity()
        with self.store.session(write=True) as session:
            version_row = self.store.version_row(session, pair_version.name, pair_version.version)
            row = ValidationRunRow(
                pair_version_id=version_row.id, status=RUNNING, golden_set=golden_set,
                golden_sha256=golden_sha256, binding_sha256=version_row.binding_sha256,
                environment={**environment, "hostname": identity["hostname"],
                             "pid_start_ticks": identity["pid_start_ticks"]},
                options=options, actor=actor, pid=identity["pid"], started_at=utcnow(),
            )
            session.add(row)
            session.flush()
            return row.to_entity(pair_version.name, pair_version.version)

    def record_check(self, run_id: int, check) -> None:
        """Persist one CheckResult of a running run, as soon as it is known."""
        with self.store.session(write=True) as session:
            session.add(CheckResultRow(validation_run_id=run_id, name=check.name, status=check.status,
                                       summary=check.summary, evidence=check.evidence,
                                       figures=dict(check.figures)))

    def finish(self, run_id: int, pair_version: PairVersion, *, passed: bool, summary: dict[str, Any],
               baselines: dict[str, Any] | None, actor: str) -> tuple[ValidationRun, PairVersion]:
        """Close a run as passed or failed and move the pair in the same transaction.

        passed: registered/validated/failed -> validated; approved and promoted keep their
        state (a passing re-validation does not withdraw an approval) but still log the event.
        failed: -> failed. The audit event names the validation run id.
        Returns (the run, the pair version after the move).
        """
        with self.store.session(write=True) as session:
            row = session.get(ValidationRunRow, run_id, with_for_update=True)
            version_row = self.store.version_row(session, pair_version.name, pair_version.version)
            current = PairState(version_row.state)
            if passed:
                to_state = current if current in (PairState.APPROVED, PairState.PROMOTED) else PairState.VALIDATED
            else:
                to_state = PairState.FAILED
            row.status = PASSED if passed else FAILED
            row.summary = summary
            row.baselines = baselines if passed else None
            row.finished_at = utcnow()
            session.flush()
            failed = [c.name for c in row.checks if c.status == CheckStatus.FAIL]
            why = f"{', '.join(failed)} failed" if failed else (summary or {}).get("reason") or "see run"
            reason = "validation passed" if passed else f"validation failed: {why}"
            moved = self.store.transition(
                pair_version.name, pair_version.version, to_state, actor=actor, action="validate",
                reason=reason, details={"validation_run_id": row.id, "golden_set": row.golden_set,
                                        "golden_sha256": row.golden_sha256, "failed_checks": failed,
                                        "run_sha256": run_content_sha256(row)},
                session=session)
            session.flush()
            return row.to_entity(pair_version.name, pair_version.version), moved

    def abort(self, run_id: int, status: RunStatus, reason: str, summary: dict[str, Any] | None = None) -> None:
        """Mark a still-running run ``aborted`` or ``error`` with the reason (and the suite's
        summary, for a run that ended because a check could not run); the pair's state is left
        as it was. A run that already finished is left alone."""
        with self.store.session(write=True) as session:
            row = session.get(ValidationRunRow, run_id, with_for_update=True)
            if row is None or row.status != RUNNING:
                return
            row.status = status
            row.error = reason[:2000]
            if summary is not None:
                row.summary = summary
            row.finished_at = utcnow()

    def reap_dead_runs(self) -> int:
        """Mark ``running`` runs of this host whose process is gone as ``abandoned`` -> how many.

        Runs started on another host (a shared PostgreSQL) are left to that host."""
        hostname = socket.gethostname()
        with self.store.session() as session:
            running = session.execute(
                select(ValidationRunRow.id, ValidationRunRow.pid, ValidationRunRow.environment,
                       ValidationRunRow.started_at).where(ValidationRunRow.status == RUNNING)).all()
        dead = [(run_id, pid, started_at) for run_id, pid, environment, started_at in running
                if (environment or {}).get("hostname") == hostname and pid is not None
                and not process_alive(pid, (environment or {}).get("pid_start_ticks"))]
        for run_id, pid, started_at in dead:
            self.abort(run_id, ABANDONED, f"its process (pid {pid} on {hostname}, started "
                       f"{started_at.isoformat(timespec='seconds')} UTC) is gone: killed before it could finish")
        return len(dead)

    def _runs_query(self):
        return (select(ValidationRunRow, PairRow.name, PairVersionRow.version)
                .join(PairVersionRow, ValidationRunRow.pair_version_id == PairVersionRow.id)
                .join(PairRow, PairVersionRow.pair_id == PairRow.id))

    def get(self, run_id: int) -> ValidationRun:
        from specreg.errors import NotFoundError

        with self.store.session() as session:
            found = session.execute(self._runs_query().where(ValidationRunRow.id == run_id)).first()
            if found is None:
                raise NotFoundError(f"unknown validation run {run_id}")
            return found[0].to_entity(*found[1:])

    def list_runs(self, name: str, version: int | None = None) -> list[ValidationRun]:
        """Runs of a pair (of one version when given), oldest first."""
        query = self._runs_query().where(PairRow.name == name)
        if version is not None:
            query = query.where(PairVersionRow.version == version)
        with self.store.session() as session:
            return [found[0].to_entity(*found[1:]) for found in session.execute(query.order_by(ValidationRunRow.id)).all()]

    def latest_passed(self, name: str, version: int) -> ValidationRun | None:
        """The newest passed run of one version (its baselines are the version's baselines)."""
        query = (self._runs_query().where(PairRow.name == name, PairVersionRow.version == version,
                                          ValidationRunRow.status == PASSED)
                 .order_by(ValidationRunRow.id.desc()).limit(1))  # of the runs the audit chain vouches for
        with self.store.session() as session:
            chain, _ = verified_chain(session)
            found = session.execute(query.where(ValidationRunRow.id.in_(chained_run_ids(session, chain)))).first()
            return found[0].to_entity(*found[1:]) if found else None

    def baselines(self, name: str, version: int) -> dict[str, Any] | None:
        run = self.latest_passed(name, version)
        return run.baselines if run else None

    def previous_baselines(self, name: str, version: int) -> tuple[int, dict[str, Any]] | None:
        """(version, baselines) of the newest lower version of ``name`` with a passed run, or
        None: what a new version's acceptance is compared with."""
        query = (self._runs_query().where(PairRow.name == name, PairVersionRow.version < version,
                                          ValidationRunRow.status == PASSED,
                                          ValidationRunRow.baselines.is_not(None))
                 .order_by(PairVersionRow.version.desc(), ValidationRunRow.id.desc()).limit(1))
        with self.store.session() as session:
            chain, _ = verified_chain(session)
            found = session.execute(query.where(ValidationRunRow.id.in_(chained_run_ids(session, chain)))).first()
            if found is None:
                return None
            row, _, found_version = found
            return found_version, in_engine_terms(row.baselines)

    def set_mlflow_run_id(self, run_id: int, mlflow_run_id: str) -> None:
        with self.store.session(write=True) as session:
            session.get(ValidationRunRow, run_id).mlflow_run_id = mlflow_run_id

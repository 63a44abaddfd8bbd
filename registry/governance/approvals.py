"""Approvals and rejections of a pair version (four-eyes): recording a decision with its audit
event, and which recorded decisions stand (the gate's approval condition)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from specreg.core.identity import normalize_user, same_user
from specreg.errors import PolicyViolation
from specreg.registry.governance.policy import EnvironmentPolicy
from specreg.registry.governance.queries import Condition, finished_runs, lock_pair
from specreg.registry.store.entities import PairState
from specreg.registry.store.orm import ApprovalRow, AuditEventRow, AuditHeadRow, PairVersionRow
from specreg.registry.store.store import Store, utcnow, verified_chain

APPROVED, REJECTED = "approved", "rejected"


UNATTRIBUTED = "unattributed"  # ApprovalRow.source


UNATTRIBUTED_ACTOR = "(unattributed)"  # ApprovalRow.actor: no user name can be spelled so


@dataclass(frozen=True)
class Approval:
    """An approval or rejection of one pair version."""

    id: int
    pair: str
    version: int
    decision: str  # approved | rejected
    actor: str
    note: str | None
    source: str  # cli | mlflow
    created_at: datetime

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "pair": self.pair, "version": self.version, "decision": self.decision,
                "actor": self.actor, "note": self.note, "source": self.source,
                "at": self.created_at.isoformat()}


def approvals_of(session: Session, pair_version_id: int) -> list[ApprovalRow]:
    """Every decision row of a version, oldest first, whether or not an event vouches for it."""
    return list(session.scalars(select(ApprovalRow).where(ApprovalRow.pair_version_id == pair_version_id)
                                .order_by(ApprovalRow.created_at, ApprovalRow.id)))


def latest_decision(session: Session, row: PairVersionRow) -> ApprovalRow | None:
    """The newest approval or rejection of ``row`` that the verified audit chain vouches for,
    by a confirmed person other than its registrant, that a later failed validation has not
    withdrawn (None: no standing decision)."""
    chain, _ = verified_chain(session)
    last_failure = next((r for r in finished_runs(session, row.id) if r.status == "failed"), None)
    standing = [a for a in chained_approvals(session, row, chain)
                if a.source != UNATTRIBUTED and not same_user(a.actor, row.registered_by)
                and (last_failure is None or a.created_at >= last_failure.finished_at)]
    return standing[-1] if standing else None


def approval_standing(store: Store, name: str, version: int, env: EnvironmentPolicy | None = None) -> Condition:
    """Whether ``name@version`` stands approved now, by the gate's approval rule (four-eyes, the
    latest decision wins, a failed validation withdraws), whatever its lifecycle state says.
    ``env``: whose approvers count (None: anyone but the registrant). An environment that needs
    no approval does not make a version approved: the Condition passes only on an approval."""
    from dataclasses import replace

    from specreg.registry.governance.policy import ENVIRONMENT_DEFAULTS

    if env is None:
        env = EnvironmentPolicy(name="export", **{**ENVIRONMENT_DEFAULTS, "required_checks": (),
                                                            "approvers": ()})
    with store.session() as session:
        chain, _ = verified_chain(session)  # a broken chain vouches for nothing: no approval counts
        return approval_condition(session, store.version_row(session, name, version),
                                  replace(env, approval_required=True), chain)


def chained_approvals(session: Session, row: PairVersionRow, chain: list[AuditEventRow]) -> list[ApprovalRow]:
    """The decisions of ``row`` that the verified audit chain vouches for: the row names an
    event (``event_hash``) of the chain, and that event records this very decision (same
    version, approval id, decision, approver, source, note). A row written straight into the
    table, or one edited after its event, does not count."""
    events = {e.event_hash: e for e in chain}
    counted = []
    for approval in approvals_of(session, row.id):
        event = events.get(approval.event_hash) if approval.event_hash else None
        if event is None:
            continue
        details = event.details or {}
        if (event.pair_name == row.pair.name and event.version == row.version
                and event.action == ("approve" if approval.decision == APPROVED else "reject")
                and details.get("approval") == approval.id and details.get("decision") == approval.decision
                and details.get("source") == approval.source and event.reason == approval.note
                and same_user(details.get("approver", event.actor), approval.actor)):
            counted.append(approval)
    return counted


def approval_condition(session: Session, row: PairVersionRow, env: EnvironmentPolicy,
                       chain: list[AuditEventRow]) -> Condition:
    """Four-eyes: the newest decision by an allowed approver other than the registrant must be
    an approval. Only decisions the verified audit chain vouches for count, and an approval
    whose approver MLflow could not confirm (source unattributed) never does. A failed
    validation withdraws earlier approvals (as the lifecycle does); a passing re-validation of
    the same binding keeps them, so `gate --rerun` can pass."""
    if not env.approval_required:
        return Condition("approval", True, f"not required for {env.name}")
    registrant = row.registered_by
    recorded = approvals_of(session, row.id)
    chained = chained_approvals(session, row, chain)
    unattributed = [a for a in chained if a.source == UNATTRIBUTED and a.decision == APPROVED]
    decisions = [a for a in chained if a not in unattributed]
    allowed = [a for a in decisions if not same_user(a.actor, registrant)
               and (a.source == UNATTRIBUTED or not env.approvers
                    or any(same_user(a.actor, who) for who in env.approvers))]
    last_failure = next((r for r in finished_runs(session, row.id) if r.status == "failed"), None)
    since = last_failure.finished_at if last_failure is not None else None
    current = [a for a in allowed if since is None or a.created_at >= since]
    who = f" from one of {', '.join(env.approvers)}" if env.approvers else ""
    if current:
        latest = current[-1]
        details = {"approval": latest.id, "actor": latest.actor, "decision": latest.decision}
        if latest.decision == APPROVED:
            return Condition("approval", True, f"approved by {latest.actor} at {latest.created_at.isoformat(timespec='seconds')}", details)
        note = f": {latest.note}" if latest.note else ""
        return Condition("approval", False, f"rejected by {latest.actor}{note}", details)
    fresh_approvals = [a for a in decisions if a.decision == APPROVED and (since is None or a.created_at >= since)]
    outsiders = [a for a in fresh_approvals if not same_user(a.actor, registrant)]
    if outsiders:
        return Condition("approval", False,
                         f"approved by {outsiders[-1].actor}, who may not approve for {env.name}{who}")
    if fresh_approvals:  # only possible through an imported (e.g. MLflow) decision
        return Condition("approval", False, f"approved only by the registrant {registrant} (four-eyes: another person must approve)")
    if allowed:
        return Condition("approval", False, f"approval by {allowed[-1].actor} predates failed validation run {last_failure.id}: approve again")
    if unattributed:
        return Condition("approval", False, f"approved in MLflow without a confirmed approver (approval "
                         f"{unattributed[-1].id}): a named approver must confirm it with `specreg approve`")
    unvouched = [a for a in recorded if a not in chained]
    if unvouched:
        return Condition("approval", False, f"{len(unvouched)} decision row(s) (approval {unvouched[-1].id} by "
                         f"{unvouched[-1].actor}) have no matching event in the verified audit chain and do not count; "
                         f"{env.name} needs an approval by someone other than the registrant {registrant}{who}")
    return Condition("approval", False, f"{env.name} needs an approval by someone other than the registrant {registrant}{who}")


def decide(store: Store, name: str, version: int, *, actor: str, decision: str, note: str | None = None,
           source: str = "cli", recorded_by: str | None = None, details: dict[str, Any] | None = None) -> Approval:
    """Record an approval or rejection of ``name@version`` with its audit event; the
    approval row carries that event's hash (a decision counts only while the chain vouches
    for it).

    ``actor``: who decided; ``recorded_by``: who put it into the registry when that is someone
    else (``specreg sync`` reading an MLflow tag; the audit event's actor, the approver goes in
    its details); ``source``: cli, mlflow (approver confirmed) or unattributed (approver
    unknown: ``actor`` is UNATTRIBUTED_ACTOR; such an approval moves no state and never
    satisfies four-eyes). Approval is refused (PolicyViolation) for the registrant
    (four-eyes), for a version whose latest validation did not pass, and for a retired
    version. An approval moves validated -> approved; a rejection moves approved ->
    validated; a promoted version keeps its state."""
    if decision not in (APPROVED, REJECTED):
        raise ValueError(f"decision must be {APPROVED} or {REJECTED}, not {decision!r}")
    unattributed = source == UNATTRIBUTED
    actor = UNATTRIBUTED_ACTOR if unattributed else normalize_user(actor, what="approver")
    recorded_by = normalize_user(recorded_by, what="actor") if recorded_by else None
    if unattributed and recorded_by is None:
        raise ValueError("an unattributed decision needs recorded_by")
    label = f"{name}@{version}"
    with store.session(write=True) as session:
        lock_pair(session, name)
        row = store.version_row(session, name, version, lock=True)
        state = PairState(row.state)
        if state is PairState.RETIRED:
            raise PolicyViolation(f"{label} is retired: nothing to {decision[:-1]}")
        runs = finished_runs(session, row.id)
        if decision == APPROVED:
            if not unattributed and same_user(actor, row.registered_by):
                raise PolicyViolation(f"four-eyes: {actor} registered {label} and cannot approve it")
            if not runs or runs[0].status != "passed":
                latest = f"run {runs[0].id} {runs[0].status}" if runs else "never validated"
                raise PolicyViolation(f"{label} has not passed validation ({latest}): approval refused")
        approval = ApprovalRow(pair_version_id=row.id, decision=decision, actor=actor, note=note, source=source,
                               created_at=utcnow())
        session.add(approval)
        session.flush()
        event_details = {**(details or {}), "approval": approval.id, "decision": decision, "source": source,
                         "validation_run": runs[0].id if runs else None}
        if recorded_by is not None:
            event_details["approver"] = actor
        action = "approve" if decision == APPROVED else "reject"
        if decision == APPROVED and state is PairState.VALIDATED and not unattributed:
            to_state = PairState.APPROVED
        elif decision == REJECTED and state is PairState.APPROVED:
            to_state = PairState.VALIDATED
        else:
            to_state = state
        event_actor = recorded_by or actor
        if to_state is state and state in (PairState.REGISTERED, PairState.VALIDATED):
            # no lifecycle move (registered/validated -> same), but the decision is still an event
            store.append_event(session, pair_name=name, version=version, action=action, from_state=state.value,
                               to_state=state.value, actor=event_actor, reason=note, details=event_details)
        else:
            store.transition(name, version, to_state, actor=event_actor, action=action, reason=note,
                             details=event_details, session=session)
        # the event just appended is the chain's head: this transaction holds the head's lock
        approval.event_hash = session.get(AuditHeadRow, 1).last_hash
        session.flush()
        return Approval(approval.id, name, version, decision, actor, note, source, approval.created_at)


def approvals(store: Store, name: str, version: int) -> list[Approval]:
    """Every approval and rejection of ``name@version``, oldest first."""
    with store.session() as session:
        row = store.version_row(session, name, version)
        return [Approval(a.id, name, version, a.decision, a.actor, a.note, a.source, a.created_at)
                for a in approvals_of(session, row.id)]

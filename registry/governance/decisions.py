"""Governance: approvals (four-eyes), promotion under a policy, rollback, retirement, the CI
gate and diffs of two versions.

Every state change here is one transaction (``Store.session(write=True)``): the pair row is
locked first (SELECT ... FOR UPDATE on PostgreSQL; BEGIN IMMEDIATE already serialises writers
on SQLite), then the environment pointer, so two promotes of one pair queue; a promote also
carries the holder it saw when it started (compare-and-set), so of two racing promotes
exactly one wins and the other gets ConcurrentUpdateError with nothing changed. Slow work
(re-fingerprinting the models, loading the golden set) happens before the transaction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from specreg.errors import (ConcurrentUpdateError, IllegalTransitionError, NotFoundError,
                            PolicyViolation)
from specreg.core.fingerprint import compare_fingerprints, fingerprint_model
from specreg.core.identity import normalize_user, same_user
from specreg.registry.governance.floors import SPEEDUP_EXCEPTION, floor_conditions
from specreg.registry.governance.policy import EnvironmentPolicy, Policy
from specreg.registry.store.entities import PairState, PairVersion
from specreg.registry.store.orm import (ApprovalRow, AuditEventRow, AuditHeadRow, EnvironmentPointerRow, PairRow,
                                        PairVersionRow, ValidationRunRow)
from specreg.registry.store.store import Store, utcnow, verified_chain

FINISHED_STATUSES = ("passed", "failed")  # running/aborted/error runs judged nothing
APPROVED, REJECTED = "approved", "rejected"
# A decision read from MLflow whose approver could not be confirmed (no name in the tag, or no
# auth app saying that user may edit the model): recorded, but an approval of this kind never
# satisfies four-eyes (a named approver confirms it with `specreg approve`).
UNATTRIBUTED = "unattributed"  # ApprovalRow.source
UNATTRIBUTED_ACTOR = "(unattributed)"  # ApprovalRow.actor: no user name can be spelled so


@dataclass(frozen=True)
class Condition:
    """One named requirement of the gate / a promotion, with why it passed or failed."""

    name: str
    passed: bool
    reason: str
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "passed": self.passed, "reason": self.reason, "details": self.details}


@dataclass(frozen=True)
class GateResult:
    """Whether ``pair@version`` may hold ``environment`` now, condition by condition."""

    pair: str
    version: int
    environment: str
    policy_source: str
    conditions: tuple[Condition, ...]
    validation_run_id: int | None
    audit_head: str | None = None  # the verified chain's newest hash when judged: anchor it

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.conditions)

    @property
    def reasons(self) -> list[str]:
        """One line per failed condition: ``name: reason``."""
        return [f"{c.name}: {c.reason}" for c in self.conditions if not c.passed]

    def to_dict(self) -> dict[str, Any]:
        return {
            "pair": self.pair, "version": self.version, "environment": self.environment,
            "passed": self.passed, "verdict": "pass" if self.passed else "refused",
            "policy": self.policy_source, "validation_run_id": self.validation_run_id,
            "audit_head": self.audit_head, "reasons": self.reasons, "conditions": [c.to_dict() for c in self.conditions],
        }


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


@dataclass(frozen=True)
class PointerMove:
    """What a promote or rollback did to one environment pointer."""

    pair: str
    environment: str
    version: int  # the new holder
    previous_version: int | None  # the holder it replaced
    action: str  # promote | rollback
    exception: dict[str, Any] | None = None  # a promote's recorded exception to min_speedup

    def to_dict(self) -> dict[str, Any]:
        return {"pair": self.pair, "environment": self.environment, "version": self.version,
                "previous_version": self.previous_version, "action": self.action,
                **({"exception": self.exception} if self.exception else {})}


# --- facts gathered outside the transaction ---------------------------------------------------

def fingerprint_changes(version: PairVersion) -> list[str]:
    """Re-fingerprint both models from their recorded paths and list what changed since
    registration (empty: identical). A missing model raises ModelReferenceError: never passes."""
    changes: list[str] = []
    for role, model in (("target", version.target), ("draft", version.draft)):
        if model is None:
            continue
        current = fingerprint_model(Path(model.path), allow_pickle=version.allow_pickle,
                                    require_tokenizer=model.fingerprint.tokenizer_sha256 is not None)
        changes += [f"{role} {change}" for change in compare_fingerprints(model.fingerprint, current)]
    return changes


def golden_set_sha256(name_or_path: str) -> str:
    """The content hash of the policy's golden set as it is now."""
    from specreg.golden_prompts.loader import load_golden_set

    return load_golden_set(name_or_path).content_sha256


# --- queries -----------------------------------------------------------------------------------

def lock_pair(session: Session, name: str) -> PairRow:
    pair = session.scalar(select(PairRow).where(PairRow.name == name).with_for_update())
    if pair is None:
        raise NotFoundError(f"unknown pair {name}")
    return pair


def pointer_row(session: Session, pair_id: int, environment: str, *, lock: bool = False) -> EnvironmentPointerRow | None:
    query = select(EnvironmentPointerRow).where(EnvironmentPointerRow.pair_id == pair_id,
                                                EnvironmentPointerRow.environment == environment)
    return session.scalar(query.with_for_update() if lock else query)


def version_number(session: Session, pair_version_id: int | None) -> int | None:
    if pair_version_id is None:
        return None
    return session.scalar(select(PairVersionRow.version).where(PairVersionRow.id == pair_version_id))


def holder_of(store: Store, name: str, environment: str) -> int | None:
    """The version number of ``name`` that holds ``environment`` now (None: nobody)."""
    with store.session() as session:
        pair_id = session.scalar(select(PairRow.id).where(PairRow.name == name))
        if pair_id is None:
            raise NotFoundError(f"unknown pair {name}")
        pointer = pointer_row(session, pair_id, environment)
        return version_number(session, pointer.pair_version_id) if pointer else None


def finished_runs(session: Session, pair_version_id: int) -> list[ValidationRunRow]:
    """Validation runs that judged the version, newest first."""
    return list(session.scalars(
        select(ValidationRunRow).where(ValidationRunRow.pair_version_id == pair_version_id,
                                       ValidationRunRow.status.in_(FINISHED_STATUSES))
        .order_by(ValidationRunRow.id.desc())))


def overall_figures(run: ValidationRunRow | None) -> dict[str, float] | None:
    """``{"acceptance_rate", "mean_acceptance_length"}`` of a run's baselines (None: none recorded)."""
    overall = ((run.baselines or {}).get("overall") or {}) if run is not None else {}
    figures = {key: overall.get(key) for key in ("acceptance_rate", "mean_acceptance_length")}
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in figures.values()):
        return None
    return {k: float(v) for k, v in figures.items()}


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


def replayed_state(row: PairVersionRow, chain: list[AuditEventRow]) -> tuple[str | None, str | None]:
    """The state of ``row`` replayed from its events in the verified chain, and the first
    disagreement between the row and its events (None: they agree). The first event must be
    the registration, by the recorded registrant, of the recorded binding."""
    mine = [e for e in chain if e.pair_name == row.pair.name and e.version == row.version]
    label = f"{row.pair.name}@{row.version}"
    if not mine or mine[0].action != "register":
        return None, f"{label} has no registration event in the audit chain (a row written outside specreg)"
    register = mine[0]
    if (register.details or {}).get("binding_sha256") != row.binding_sha256:
        return None, f"{label}: binding differs from its registration event"
    if not same_user(register.actor, row.registered_by):
        return None, (f"{label}: registrant {row.registered_by!r} differs from its registration event's actor "
                      f"{register.actor!r}")
    state = mine[-1].to_state
    if state != row.state:
        return state, f"{label} is {row.state} in its row but {state} by its audit events"
    return state, None


def audit_condition(row: PairVersionRow, chain: list[AuditEventRow], problem: str | None) -> Condition:
    """The audit chain links, and the version's row agrees with what its events say."""
    if problem is not None:
        return Condition("audit", False, f"audit log broken: {problem}")
    _, disagreement = replayed_state(row, chain)
    if disagreement is not None:
        return Condition("audit", False, disagreement)
    head = chain[-1].event_hash if chain else None
    return Condition("audit", True, f"chain of {len(chain)} event(s) intact; state {row.state} as its events say",
                     {"audit_head": head})


# --- the conditions ----------------------------------------------------------------------------

def evaluate(session: Session, row: PairVersionRow, env: EnvironmentPolicy, *, golden_sha256: str,
             changes: list[str], holder: PairVersionRow | None, now: datetime) -> tuple[list[Condition], ValidationRunRow | None]:
    """Every condition for ``row`` to hold environment ``env``, read inside ``session``.

    ``golden_sha256``: the policy's golden set hash now; ``changes``: fingerprint_changes();
    ``holder``: the version holding the environment now (its baseline is a reference).
    Returns (conditions, the validation run they are based on)."""
    label = f"{row.pair.name}@{row.version}"
    conditions: list[Condition] = []
    chain, problem = verified_chain(session)
    conditions.append(audit_condition(row, chain, problem))
    conditions.append(Condition("not_retired", row.state != PairState.RETIRED.value,
                                f"{label} is retired" if row.state == PairState.RETIRED.value
                                else f"{label} is {row.state}"))

    runs = finished_runs(session, row.id)
    relevant = [r for r in runs if r.golden_set == env.golden_set or r.golden_sha256 == golden_sha256]
    run = relevant[0] if relevant else None
    if run is None:
        elsewhere = f" (its latest validation used golden set {runs[0].golden_set})" if runs else ""
        conditions.append(Condition("validation", False,
                                    f"{label} is not validated on golden set {env.golden_set}{elsewhere}"))
    elif run.status != "passed":
        conditions.append(Condition("validation", False,
                                    f"the latest validation of {label} on {env.golden_set} (run {run.id}) {run.status}",
                                    {"run": run.id, "status": run.status}))
    else:
        conditions.append(Condition("validation", True, f"run {run.id} passed on {env.golden_set}",
                                    {"run": run.id, "finished_at": run.finished_at.isoformat() if run.finished_at else None}))

    if run is None:
        conditions.append(Condition("golden_set", False, "no validation to compare"))
    elif run.golden_sha256 != golden_sha256:
        conditions.append(Condition("golden_set", False,
                                    f"golden set {env.golden_set} changed since run {run.id} "
                                    f"({run.golden_sha256[:12]} -> {golden_sha256[:12]}): validate again",
                                    {"validated": run.golden_sha256, "now": golden_sha256}))
    else:
        conditions.append(Condition("golden_set", True, f"same golden set hash {golden_sha256[:12]}",
                                    {"sha256": golden_sha256}))

    if changes:
        conditions.append(Condition("fingerprints", False, "models changed since registration: " + ", ".join(changes),
                                    {"changes": changes}))
    elif run is not None and run.binding_sha256 != row.binding_sha256:
        conditions.append(Condition("fingerprints", False, f"run {run.id} validated another binding "
                                    f"({run.binding_sha256[:12]}, version binds {row.binding_sha256[:12]})"))
    else:
        conditions.append(Condition("fingerprints", True, "weights, tokenizer, chat template and config unchanged"))

    if env.max_validation_age_days is not None:
        finished = run.finished_at if run is not None else None
        if finished is None:
            conditions.append(Condition("validation_age", False, "no finished validation"))
        else:
            age_days = (now - finished) / timedelta(days=1)
            fresh = age_days <= env.max_validation_age_days
            conditions.append(Condition(
                "validation_age", fresh,
                f"run {run.id} is {age_days:.1f} days old (limit {env.max_validation_age_days:g})",
                {"age_days": round(age_days, 3), "limit_days": env.max_validation_age_days}))

    checks = {c.name: c for c in run.checks} if run is not None else {}
    accepted = ("pass", "warn") if env.allow_warnings else ("pass",)
    for name in env.checks_for(row.method):  # per pair kind where the policy says so
        check = checks.get(name)
        if run is None:
            conditions.append(Condition(f"check.{name}", False, "no validation"))
        elif check is None:
            conditions.append(Condition(f"check.{name}", False, f"run {run.id} did not run check {name}"))
        else:
            conditions.append(Condition(f"check.{name}", check.status in accepted,
                                        f"{check.status}: {check.summary}", {"status": check.status}))

    figures = overall_figures(run) if run is not None and run.status == "passed" else None
    conditions.append(Condition("baselines", figures is not None,
                                f"run {run.id} recorded acceptance baselines" if figures
                                else "no acceptance baselines recorded" + (f" in run {run.id}" if run else ""),
                                {"overall": figures} if figures else {}))
    conditions.append(acceptance_condition(session, row, run, figures, env, golden_sha256, holder))
    events = [e for e in chain if e.pair_name == row.pair.name and e.version == row.version]
    conditions += floor_conditions(run, env, overall_figures(run) if run is not None else None, events)
    conditions.append(approval_condition(session, row, env, chain))
    return conditions, run


def acceptance_condition(session: Session, row: PairVersionRow, run: ValidationRunRow | None,
                         figures: dict[str, float] | None, env: EnvironmentPolicy, golden_sha256: str,
                         holder: PairVersionRow | None) -> Condition:
    """Acceptance >= baseline * (1 - tolerance) against (a) the version's own earlier passed run
    on the same golden set (drift) and (b) the environment's current holder."""
    if figures is None:
        return Condition("acceptance", False, "no acceptance figures to compare")
    references: list[tuple[str, ValidationRunRow]] = []
    earlier = [r for r in finished_runs(session, row.id)
               if r.id < run.id and r.status == "passed" and r.golden_sha256 == golden_sha256]
    if earlier and overall_figures(earlier[0]):
        references.append((f"run {earlier[0].id} of this version", earlier[0]))
    if holder is not None and holder.id != row.id:
        holder_runs = [r for r in finished_runs(session, holder.id)
                       if r.status == "passed" and r.golden_sha256 == golden_sha256]
        if holder_runs and overall_figures(holder_runs[0]):
            references.append((f"{env.name} holder {holder.pair.name}@{holder.version}", holder_runs[0]))
    if not references:
        return Condition("acceptance", True,
                         f"acceptance rate {figures['acceptance_rate']:.3f}; no earlier baseline on this golden set",
                         {"figures": figures})
    drops: list[str] = []
    compared: list[dict[str, Any]] = []
    k = (run.baselines or {}).get("k")
    for source, reference in references:
        baseline = overall_figures(reference)
        # tau counts up to k + 1 tokens a step: comparable only at the same k; alpha-hat always
        same_k = k is not None and (reference.baselines or {}).get("k") == k
        for key, value in figures.items():
            if key == "mean_acceptance_length" and not same_k:
                continue
            floor = baseline[key] * (1 - env.acceptance_tolerance)
            compared.append({"reference": source, "figure": key, "value": value, "baseline": baseline[key], "floor": floor})
            if value < floor:
                drops.append(f"{key} {value:.3f} < {floor:.3f} ({source} {baseline[key]:.3f} - {env.acceptance_tolerance:.0%})")
    if drops:
        return Condition("acceptance", False, "; ".join(drops), {"compared": compared})
    return Condition("acceptance", True,
                     f"acceptance rate {figures['acceptance_rate']:.3f} within {env.acceptance_tolerance:.0%} of "
                     + ", ".join(source for source, _ in references), {"compared": compared})


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


def audit_check(store: Store, version: PairVersion) -> Condition:
    """``audit_condition`` of one version in a read session (for export and sync)."""
    with store.session() as session:
        row = store.version_row(session, version.name, version.version)
        chain, problem = verified_chain(session)
        return audit_condition(row, chain, problem)


# --- the gate ----------------------------------------------------------------------------------

def gate(store: Store, policy: Policy, version: PairVersion, environment: str) -> GateResult:
    """Evaluate every condition for ``version`` to hold ``environment`` (read only)."""
    env = policy.environment(environment)
    changes = fingerprint_changes(version)
    golden_sha256 = golden_set_sha256(env.golden_set)
    with store.session() as session:
        row = store.version_row(session, version.name, version.version)
        pointer = pointer_row(session, row.pair_id, environment)
        holder = session.get(PairVersionRow, pointer.pair_version_id) if pointer and pointer.pair_version_id else None
        conditions, run = evaluate(session, row, env, golden_sha256=golden_sha256, changes=changes,
                                   holder=holder, now=utcnow())
        head = next((c.details.get("audit_head") for c in conditions if c.name == "audit"), None)
        return GateResult(version.name, version.version, environment, policy.source, tuple(conditions),
                          run.id if run is not None else None, head)


# --- state changes -----------------------------------------------------------------------------

def release(store: Store, session: Session, row: PairVersionRow, *, actor: str, environment: str,
            replaced_by: int | None, reason: str | None) -> None:
    """A version lost ``environment``: when it holds no other environment its state returns
    to approved (validated if it never had an approval), with an audit event."""
    still_holds = session.scalar(select(EnvironmentPointerRow.id).where(
        EnvironmentPointerRow.pair_version_id == row.id, EnvironmentPointerRow.environment != environment))
    if still_holds is not None or row.state != PairState.PROMOTED.value:
        return
    chain, _ = verified_chain(session)
    approved = any(a.decision == APPROVED and a.source != UNATTRIBUTED and not same_user(a.actor, row.registered_by)
                   for a in chained_approvals(session, row, chain))
    store.transition(row.pair.name, row.version, PairState.APPROVED if approved else PairState.VALIDATED,
                     actor=actor, action="release", reason=reason,
                     details={"environment": environment, "replaced_by": replaced_by}, session=session)


def promote(store: Store, policy: Policy, name: str, version: int, environment: str, *, actor: str,
            expected_holder: int | None, reason: str | None = None, allow_slower: str | None = None) -> PointerMove:
    """Make ``name@version`` the holder of ``environment`` if the policy allows it.

    ``expected_holder``: the version number (None: nobody) the caller saw holding the
    environment; if another promote moved the pointer since, ConcurrentUpdateError and nothing
    changes. Refusals raise PolicyViolation naming every failed condition. The pointer, the
    previous holder, the state moves and the audit events are one transaction."""
    env = policy.environment(environment)
    version_entity = store.get_version(name, version)
    changes = fingerprint_changes(version_entity)
    golden_sha256 = golden_set_sha256(env.golden_set)
    label = f"{name}@{version}"
    with store.session(write=True) as session:
        pair = lock_pair(session, name)
        row = store.version_row(session, name, version, lock=True)
        pointer = pointer_row(session, pair.id, environment, lock=True)
        holder = session.get(PairVersionRow, pointer.pair_version_id) if pointer and pointer.pair_version_id else None
        holder_version = holder.version if holder else None
        if holder_version != expected_holder:
            raise ConcurrentUpdateError(
                f"{name}@{environment} is now held by {describe_holder(holder_version)} (moved by {pointer.updated_by} "
                f"at {pointer.updated_at.isoformat(timespec='seconds')}), not {describe_holder(expected_holder)} as when "
                f"this promote started: nothing changed")
        if holder is not None and holder.id == row.id:
            raise IllegalTransitionError(f"{label} already holds {environment}: nothing to do")
        conditions, run = evaluate(session, row, env, golden_sha256=golden_sha256, changes=changes,
                                   holder=holder, now=utcnow())
        # an exception waives a measured speedup below the floor, never a speedup not measured
        excepted = next((c for c in conditions if c.name == SPEEDUP_EXCEPTION and not c.passed
                         and "speedup" in c.details), None) if allow_slower else None
        failed = [c for c in conditions if not c.passed and c is not excepted]
        if failed:
            raise PolicyViolation(f"cannot promote {label} to {environment}: "
                                  + "; ".join(f"{c.name}: {c.reason}" for c in failed),
                                  reasons=[(c.name, c.reason) for c in failed])
        now = utcnow()
        if pointer is None:
            pointer = EnvironmentPointerRow(pair_id=pair.id, environment=environment, pair_version_id=row.id,
                                            previous_version_id=None, updated_by=actor, updated_at=now)
            session.add(pointer)
        else:
            pointer.previous_version_id = pointer.pair_version_id
            pointer.pair_version_id, pointer.updated_by, pointer.updated_at = row.id, actor, now
        session.flush()
        approval = next((c.details.get("approval") for c in conditions if c.name == "approval"), None)
        store.transition(name, version, PairState.PROMOTED, actor=actor, action="promote", reason=reason,
                         details={"environment": environment, "previous_version": holder_version,
                                  "validation_run": run.id if run else None, "approval": approval,
                                  "policy": policy.source,
                                  **({"exception": {"condition": SPEEDUP_EXCEPTION, "reason": allow_slower,
                                                    **excepted.details}} if excepted else {})},
                         session=session)
        if holder is not None:
            release(store, session, holder, actor=actor, environment=environment, replaced_by=version,
                    reason=f"{label} promoted to {environment}")
        return PointerMove(name, environment, version, holder_version, "promote",
                           {"condition": SPEEDUP_EXCEPTION, "reason": allow_slower, **excepted.details}
                           if excepted else None)


def describe_holder(version: int | None) -> str:
    return f"version {version}" if version is not None else "no version"


def rollback(store: Store, name: str, environment: str, *, actor: str, reason: str | None = None) -> PointerMove:
    """Point ``environment`` back at the version that held it before, in one transaction.

    The rolled-back version releases the environment; the previous one becomes the holder. It
    is refused (PolicyViolation) when the previous one is retired or failed, when the latest
    decision on it is a rejection, or when its models changed since registration (re-hashed
    here, before the transaction). Afterwards no earlier holder is remembered: a second
    rollback is refused rather than flipping back to the version just rolled back."""
    seen_previous, changes = None, []
    with store.session() as session:
        pair_id = session.scalar(select(PairRow.id).where(PairRow.name == name))
        pointer = pointer_row(session, pair_id, environment) if pair_id is not None else None
        if pointer is not None and pointer.previous_version_id is not None:
            seen_previous = version_number(session, pointer.previous_version_id)
    if seen_previous is not None:
        # slow (hashes every weight file): outside the transaction, re-checked against the pointer below
        changes = fingerprint_changes(store.get_version(name, seen_previous))
    with store.session(write=True) as session:
        pair = lock_pair(session, name)
        pointer = pointer_row(session, pair.id, environment, lock=True)
        if pointer is None:
            raise NotFoundError(f"no version of {name} has held environment {environment}")
        if pointer.previous_version_id is None:
            raise IllegalTransitionError(f"{name}@{environment}: no previous holder recorded to roll back to; "
                                         f"promote a version explicitly")
        previous = session.get(PairVersionRow, pointer.previous_version_id, with_for_update=True)
        if previous.version != seen_previous:
            raise ConcurrentUpdateError(f"{name}@{environment}: the previous holder changed while rolling back "
                                        f"(now {name}@{previous.version}): nothing changed, run it again")
        target = f"cannot roll back {name}@{environment} to {name}@{previous.version}"
        if previous.state in (PairState.RETIRED.value, PairState.FAILED.value):
            raise PolicyViolation(f"{target}: it is {previous.state}")
        latest = latest_decision(session, previous)
        if latest is not None and latest.decision == REJECTED:
            note = f": {latest.note}" if latest.note else ""
            raise PolicyViolation(f"{target}: it was rejected by {latest.actor}{note}")
        if changes:
            raise PolicyViolation(f"{target}: its models changed since registration: {', '.join(changes)}")
        current = session.get(PairVersionRow, pointer.pair_version_id) if pointer.pair_version_id else None
        current_version = current.version if current else None
        pointer.pair_version_id, pointer.previous_version_id = previous.id, None
        pointer.updated_by, pointer.updated_at = actor, utcnow()
        session.flush()
        store.transition(name, previous.version, PairState.PROMOTED, actor=actor, action="rollback", reason=reason,
                         details={"environment": environment, "previous_version": current_version}, session=session)
        if current is not None:
            release(store, session, current, actor=actor, environment=environment, replaced_by=previous.version,
                    reason=f"rolled back to {name}@{previous.version}")
        return PointerMove(name, environment, previous.version, current_version, "rollback")


def retire(store: Store, name: str, version: int, *, actor: str, reason: str | None = None,
           force: bool = False) -> PairVersion:
    """Retire ``name@version``. Refused (PolicyViolation) while it holds an environment unless
    ``force``: then those environments are left without a holder (``rollback`` restores their
    previous one)."""
    label = f"{name}@{version}"
    with store.session(write=True) as session:
        lock_pair(session, name)
        row = store.version_row(session, name, version, lock=True)
        held = list(session.scalars(select(EnvironmentPointerRow).where(
            EnvironmentPointerRow.pair_version_id == row.id).with_for_update()))
        environments = sorted(p.environment for p in held)
        if held and not force:
            raise PolicyViolation(f"{label} holds {', '.join(environments)}: roll back or promote another version "
                                  f"first, or retire with --force")
        now = utcnow()
        for pointer in held:
            pointer.pair_version_id, pointer.updated_by, pointer.updated_at = None, actor, now
        # a retired version can no longer be a rollback target
        for pointer in session.scalars(select(EnvironmentPointerRow).where(
                EnvironmentPointerRow.previous_version_id == row.id).with_for_update()):
            pointer.previous_version_id = None
        session.flush()
        return store.transition(name, version, PairState.RETIRED, actor=actor, action="retire", reason=reason,
                                details={"released": environments, "force": force}, session=session)


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


# --- reading -----------------------------------------------------------------------------------

def approvals(store: Store, name: str, version: int) -> list[Approval]:
    """Every approval and rejection of ``name@version``, oldest first."""
    with store.session() as session:
        row = store.version_row(session, name, version)
        return [Approval(a.id, name, version, a.decision, a.actor, a.note, a.source, a.created_at)
                for a in approvals_of(session, row.id)]


def environment_pointers(store: Store, name: str | None = None) -> list[dict[str, Any]]:
    """Every environment pointer (of one pair or all): holder and previous holder."""
    with store.session() as session:
        query = select(EnvironmentPointerRow, PairRow.name).join(PairRow, PairRow.id == EnvironmentPointerRow.pair_id)
        if name is not None:
            if session.scalar(select(PairRow.id).where(PairRow.name == name)) is None:
                raise NotFoundError(f"unknown pair {name}")
            query = query.where(PairRow.name == name)
        rows = session.execute(query.order_by(PairRow.name, EnvironmentPointerRow.environment)).all()
        return [{"pair": pair_name, "environment": p.environment,
                 "version": version_number(session, p.pair_version_id),
                 "previous_version": version_number(session, p.previous_version_id),
                 "updated_by": p.updated_by, "updated_at": p.updated_at.isoformat(timespec="seconds")}
                for p, pair_name in rows]


def latest_validation_summary(store: Store, version: PairVersion) -> dict[str, Any] | None:
    """Figures of the newest finished validation of ``version`` (for diff), or None."""
    with store.session() as session:
        runs = finished_runs(session, version.id)
        if not runs:
            return None
        run = runs[0]
        baselines = run.baselines or {}
        overall = baselines.get("overall") or {}
        return {
            "run": run.id, "status": run.status, "golden_set": run.golden_set, "golden_sha256": run.golden_sha256,
            "finished_at": run.finished_at.isoformat(timespec="seconds") if run.finished_at else None,
            "acceptance_rate": overall.get("acceptance_rate"),
            "mean_acceptance_length": overall.get("mean_acceptance_length"),
            "per_position_acceptance": overall.get("per_position_acceptance"),
            "categories": {cat: (figs or {}).get("acceptance_rate")
                           for cat, figs in (baselines.get("per_category") or {}).items()},
            "checks": {c.name: c.status for c in run.checks},
        }


def diff(store: Store, a: PairVersion, b: PairVersion) -> list[dict[str, Any]]:
    """Side by side: models, fingerprints (weights, tokenizer, chat template, config), speculative
    config and validation figures of two versions (any pairs). Rows: section, field, a, b, same."""
    rows: list[dict[str, Any]] = []

    def add(section: str, name: str, value_a: Any, value_b: Any) -> None:
        rows.append({"section": section, "field": name, "a": value_a, "b": value_b, "same": value_a == value_b})

    add("version", "state", a.state.value, b.state.value)
    add("version", "registered_by", a.registered_by, b.registered_by)
    add("version", "binding_sha256", a.binding_sha256, b.binding_sha256)
    for role in ("target", "draft"):
        model_a, model_b = getattr(a, role), getattr(b, role)
        add(role, "reference", model_a.reference if model_a else None, model_b.reference if model_b else None)
        for key in ("weights_sha256", "tokenizer_sha256", "chat_template_sha256", "config_sha256", "architecture",
                    "vocab_size", "tokenizer_length", "parameter_count", "dtype", "max_position_embeddings"):
            add(role, key, getattr(model_a.fingerprint, key) if model_a else None,
                getattr(model_b.fingerprint, key) if model_b else None)
    for key, value_a in a.config.to_dict().items():
        add("config", key, value_a, b.config.to_dict()[key])
    summary_a, summary_b = latest_validation_summary(store, a) or {}, latest_validation_summary(store, b) or {}
    for key in ("run", "status", "golden_set", "golden_sha256", "finished_at", "acceptance_rate",
                "mean_acceptance_length", "per_position_acceptance"):
        add("validation", key, summary_a.get(key), summary_b.get(key))
    categories = list(dict.fromkeys([*(summary_a.get("categories") or {}), *(summary_b.get("categories") or {})]))
    for category in categories:
        add("validation", f"acceptance_rate.{category}", (summary_a.get("categories") or {}).get(category),
            (summary_b.get("categories") or {}).get(category))
    checks = list(dict.fromkeys([*(summary_a.get("checks") or {}), *(summary_b.get("checks") or {})]))
    for check in checks:
        add("checks", check, (summary_a.get("checks") or {}).get(check), (summary_b.get("checks") or {}).get(check))
    return rows

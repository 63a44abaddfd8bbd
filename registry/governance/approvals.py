"""Approvals and rejections of a pair version (four-eyes): recording a signed decision with its
audit event, and which recorded decisions stand (the gate's approval condition).

A decision is the approver's signature (governance/signatures.py) over the version's binding,
the decision, the environment, the policy's hash and the validation run seen. The registry
keeps it in an ``approvals`` row that names the audit event recording it; the gate, promote
and export count a row only while (a) that event is in the verified chain and says the same,
and (b) its signature verifies with a key the keyring enrols to the row's approver. Anything
else counts for nothing and is reported by name.
"""

from __future__ import annotations

from dataclasses import replace

from specreg.core.user_names import same_user
from specreg.errors import PolicyViolation
from specreg.registry.governance.keyring import keyring_entries, written_by_its_actor
from specreg.registry.governance.policy import EnvironmentPolicy, Policy
from specreg.registry.governance.queries import Condition, finished_runs
from specreg.registry.governance.signatures import (ANY_SCOPE, APPROVED, REJECTED, KeyringEntry, SignedDecision,
                                                    Tally, approval_predicate, check_decision, sign_decision, tally)
from specreg.registry.governance.signed_writes import signed_write, version_lock
from specreg.registry.store import approval_records
from specreg.registry.store.entities import Approval, AuditEvent, PairState, PairVersion
from specreg.registry.store.store import Session, Store, utcnow, verified_chain

__all__ = ["APPROVED", "REJECTED", "ANY_SCOPE", "Approval"]


def chained_approvals(session: Session, row: PairVersion, chain: list[AuditEvent]) -> list[Approval]:
    """The decisions of ``row`` that the verified audit chain vouches for: the row names an
    event (``event_hash``) of the chain, and that event records this very decision (same
    version, approval id, decision, approver, note), written (PostgreSQL) by the approver's role."""
    events = {e.event_hash: e for e in chain}
    counted = []
    for approval in approval_records.approvals_of(session, row):
        event = events.get(approval.event_hash) if approval.event_hash else None
        if event is None:
            continue
        details = event.details or {}
        if (event.pair_name == row.name and event.version == row.version
                and event.action == ("approve" if approval.decision == APPROVED else "reject")
                and details.get("approval") == approval.id and details.get("decision") == approval.decision
                and details.get("source") == approval.source and event.reason == approval.note
                and same_user(details.get("approver", event.actor), approval.actor)
                and written_by_its_actor(event)):
            counted.append(approval)
    return counted


def signed_decisions(session: Session, row: PairVersion, chain: list[AuditEvent],
                     keyring: dict[str, KeyringEntry],
                     policy: Policy | None = None) -> tuple[list[tuple[Approval, SignedDecision]], list[str]]:
    """(the decisions of ``row`` that count: chained and validly signed by their approver, one
    line per decision row that does not count and why). With ``policy``, an approval counts only
    under the policy it signed (a policy change asks approvers to sign again); a rejection
    counts under any, so that no policy change revives a rejected version. A decision's time is
    its audit event's time, never the time the signer wrote into it."""
    chained = {a.id for a in chained_approvals(session, row, chain)}
    events = {e.event_hash: e for e in chain}
    valid, refused = [], []
    for approval in approval_records.approvals_of(session, row):
        label = f"{'approval' if approval.decision == APPROVED else 'rejection'} {approval.id} by {approval.actor}"
        event = events.get(approval.event_hash) if approval.event_hash else None
        problems = []  # every reason, so each defence is visible on its own
        if approval.id not in chained and event is not None and not written_by_its_actor(event):
            problems.append(f"its audit event says {event.actor} but database role {event.session_role} wrote it")
        elif approval.id not in chained:
            problems.append("no matching event in the verified audit chain")
        try:
            signed = check_decision(approval.signature, keyring, pair=row.name, version=row.version,
                                    binding_sha256=row.binding_sha256)
            if signed.decision != approval.decision or not same_user(signed.approver, approval.actor):
                problems.append(f"its signature says {signed.decision} by {signed.approver}")
            if policy is not None and signed.decision == APPROVED \
                    and signed.predicate.get("policy_sha256") != policy.sha256:
                problems.append(f"signed under another policy than {policy.source} (approve again under it)")
        except ValueError as exc:
            problems.append(str(exc))
        if problems:
            refused.append(f"{label}: {'; '.join(problems)}")
        else:
            valid.append((approval, replace(signed, signed_at=event.created_at)))
    return valid, refused


def standing(session: Session, row: PairVersion, env: EnvironmentPolicy, policy: Policy,
             chain: list[AuditEvent]) -> tuple[Tally, list[str], list[Approval]]:
    """The tally of ``row``'s signed decisions for ``env`` (a failed validation withdraws the
    decisions signed before it), the lines naming what did not count, and the approval rows
    whose signatures count now."""
    keyring, bad_keys = keyring_entries(session, policy, chain)
    valid, refused = signed_decisions(session, row, chain, keyring, policy)
    last_failure = next((r for r in finished_runs(session, row, chain) if r.status == "failed"), None)
    result = tally([signed for _, signed in valid], registrant=row.registered_by, approvers=env.approvers,
                   scope=env.name, threshold=env.approvals_required,
                   since=last_failure.finished_at if last_failure is not None else None,
                   what=env.name if env.name != ANY_SCOPE else row.label)
    stale = [s for _, s in valid if last_failure is not None and s.decision == APPROVED
             and s.signed_at < last_failure.finished_at and not same_user(s.approver, row.registered_by)]
    if stale and not result.passed and not any(s.signed_at >= last_failure.finished_at for _, s in valid):
        result = Tally(False, f"approval by {stale[-1].approver} predates failed validation run {last_failure.id}: "
                              f"approve again", (), None)
    counted = [a for a, s in valid if s.decision == APPROVED and s.approver in result.approvers
               and (last_failure is None or s.signed_at >= last_failure.finished_at)]
    return result, refused + bad_keys, counted


def approval_condition(session: Session, row: PairVersion, env: EnvironmentPolicy, policy: Policy,
                       chain: list[AuditEvent]) -> Condition:
    """Four-eyes by signatures: ``env.approvals_required`` people other than the registrant (of
    ``env.approvers`` when named) signed an approval since the newest signed rejection."""
    if not env.approval_required:
        return Condition("approval", True, f"not required for {env.name}")
    result, refused, counted = standing(session, row, env, policy, chain)
    details = {"approvers": list(result.approvers), "threshold": env.approvals_required, "not_counted": refused,
               "approval": counted[-1].id if result.passed and counted else None}
    reason = result.reason
    if not result.passed and refused:
        reason += "; not counted: " + "; ".join(refused)
    return Condition("approval", result.passed, reason, details)


def export_environment(policy: Policy) -> EnvironmentPolicy:
    """The approval rule for an export not tied to an environment: one signature by anyone but
    the registrant."""
    from specreg.registry.governance.policy import ENVIRONMENT_DEFAULTS

    return EnvironmentPolicy(name=ANY_SCOPE, **{**ENVIRONMENT_DEFAULTS, "required_checks": (), "approvers": (),
                                                "approval_required": True})


def approval_standing(store: Store, policy: Policy, name: str, version: int,
                      env: EnvironmentPolicy | None = None) -> Condition:
    """Whether ``name@version`` stands approved now by the gate's rule for ``env`` (None: one
    signature by anyone but the registrant), whatever its lifecycle state says. An environment
    that needs no approval does not make a version approved: the Condition passes only on
    signed approvals."""
    from dataclasses import replace

    env = replace(env, approval_required=True) if env is not None else export_environment(policy)
    with store.session() as session:
        chain, _ = verified_chain(session)  # a broken chain vouches for nothing: no approval counts
        return approval_condition(session, store.pair_version(session, name, version), env, policy, chain)


def rejected_by(session: Session, row: PairVersion, policy: Policy) -> str | None:
    """Who stands as having rejected ``row`` (signed, not withdrawn by a later approval), or None."""
    chain, _ = verified_chain(session)
    return standing(session, row, export_environment(policy), policy, chain)[0].rejected_by


def counted_approvals(store: Store, policy: Policy, name: str, version: int) -> list[Approval]:
    """The decisions of ``name@version`` whose signatures count now (for the pair lock)."""
    with store.session() as session:
        row = store.pair_version(session, name, version)
        chain, _ = verified_chain(session)
        keyring, _ = keyring_entries(session, policy, chain)
        valid, _ = signed_decisions(session, row, chain, keyring, policy)
        return [a for a, _ in valid]


def rejection_standing(store: Store, name: str, version: int) -> str | None:
    """Who stands as having rejected ``name@version`` under the policy of record now (signed, not
    withdrawn by a later approval), or None."""
    from specreg.registry.governance.policy_record import replay

    with store.session() as session:
        return rejected_by(session, store.pair_version(session, name, version), replay(session).policy)


def decide(store: Store, policy: Policy, name: str, version: int, *, actor: str, decision: str, key: str,
           note: str | None = None, scope: str = ANY_SCOPE) -> Approval:
    """Sign and record an approval or rejection of ``name@version`` by ``actor`` with the
    private key file ``key``, with its audit event; the approval row carries that event's hash.

    Refused (PolicyViolation) when ``key`` is not enrolled to ``actor`` in the keyring, for the
    registrant's own approval (four-eyes), for a version whose latest validation did not pass,
    and for a retired version. ``scope``: the environment the decision is for (``*``: any). An
    approval moves validated -> approved; a rejection moves approved -> validated; a promoted
    version keeps its state."""
    if decision not in (APPROVED, REJECTED):
        raise ValueError(f"decision must be {APPROVED} or {REJECTED}, not {decision!r}")
    label = f"{name}@{version}"

    with signed_write(store, actor=actor, key=key, what=f"record a decision on {label}",
                      lock=version_lock(store, name, version)) as write:
        session, actor, row, kid = write.session, write.actor, write.locked, write.key_id
        write.enrolled(policy)
        state = row.state
        if state is PairState.RETIRED:
            raise PolicyViolation(f"{label} is retired: nothing to {decision[:-1]}")
        runs = finished_runs(session, row, write.chain)
        if decision == APPROVED:
            if same_user(actor, row.registered_by):
                raise PolicyViolation(f"four-eyes: {actor} registered {label} and cannot approve it")
            if not runs or runs[0].status != "passed":
                latest = f"run {runs[0].id} {runs[0].status}" if runs else "never validated"
                raise PolicyViolation(f"{label} has not passed validation ({latest}): approval refused")
        now = utcnow()
        predicate = approval_predicate(pair=name, version=version, binding_sha256=row.binding_sha256,
                                       decision=decision, scope=scope, policy_sha256=policy.sha256,
                                       validation_run=runs[0].id if runs else None, approver=actor, signed_at=now,
                                       note=note)
        approval_id = approval_records.add_approval(
            session, row, decision=decision, actor=actor, note=note, created_at=now,
            signature=sign_decision(write.signer, predicate), key_id=kid, scope=scope)
        event_details = {"approval": approval_id, "decision": decision, "source": "cli", "scope": scope,
                         "key_id": kid, "policy_sha256": policy.sha256, "policy_version": policy.version,
                         "validation_run": runs[0].id if runs else None}
        action = "approve" if decision == APPROVED else "reject"
        if decision == APPROVED and state is PairState.VALIDATED:
            to_state = PairState.APPROVED
        elif decision == REJECTED and state is PairState.APPROVED:
            to_state = PairState.VALIDATED
        else:
            to_state = state
        if to_state is state and state in (PairState.REGISTERED, PairState.VALIDATED):
            # no lifecycle move (registered/validated -> same), but the decision is still an event
            store.append_event(session, pair_name=name, version=version, action=action, from_state=state.value,
                               to_state=state.value, actor=actor, reason=note, details=event_details)
        else:
            store.transition(name, version, to_state, actor=actor, action=action, reason=note,
                             details=event_details, session=session)
        # the event just appended is the chain's head: this transaction holds the head's lock
        return approval_records.mark_recorded(session, row, approval_id, store.head_hash(session))


def approvals(store: Store, name: str, version: int) -> list[Approval]:
    """Every approval and rejection row of ``name@version``, oldest first (counted or not)."""
    with store.session() as session:
        return approval_records.approvals_of(session, store.pair_version(session, name, version))

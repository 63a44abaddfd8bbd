"""The policy of record: the promotion policy as versioned documents in the registry, changed
only by an audited four-eyes action, never by a file the caller chooses.

A change is proposed (`specreg policy propose FILE`: a ``policy_versions`` row with the
document's text and a ``policy-propose`` event) and governs once enough people have signed it
under the rule of the policy in effect before it (``change_rule``: its production environment's
approvers and ``approvals_required``, at least one person other than the proposer, with keys the
proposer did not enrol). The approval that completes the rule appends a ``policy-activate``
event. What governs is replayed from the verified audit chain every time it is read: from the
built-in default (version 0), each activation counts only when its proposal event matches the
row, the row's document still hashes to what was proposed, and its signed approvals (each on the
chain, written by its signer, by a key the keyring of the policy then in effect enrols and has
not revoked, signed under that very policy) meet that policy's rule. Anything else counts for
nothing and is named (``PolicyRecord.problems``).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from specreg.core.digests import sha256_hex
from specreg.core.user_names import normalize_user, same_user
from specreg.errors import NotFoundError, PolicyViolation, SpecregError, UsageError
from specreg.registry.governance.keyring import Eras, keyring_entries, written_by_its_actor
from specreg.registry.governance.policy import (EnvironmentPolicy, Policy, builtin_policy, parse_policy_text,
                                                read_policy_file)
from specreg.registry.governance.signatures import (ANY_SCOPE, APPROVED, POLICY_PREDICATE_TYPE, Tally,
                                                    approval_predicate, check_decision, sign_decision, tally)
from specreg.registry.governance.signed_writes import signed_write
from specreg.registry.store import policy_versions
from specreg.registry.store.entities import AuditEvent, PolicyDocument
from specreg.registry.store.store import Session, Store, utcnow, verified_chain

PROPOSE, APPROVE, ACTIVATE = "policy-propose", "policy-approve", "policy-activate"
POLICY_EVENT_PAIR = "-"  # policy events belong to no pair
POLICY_SUBJECT = "policy"  # what a policy approval's statement names: policy@VERSION


@dataclass(frozen=True)
class PolicyRecord:
    """The policy that governs now, with how it came to (None for the built-in default)."""

    policy: Policy
    activated_at: datetime | None = None
    approved_by: tuple[str, ...] = ()
    proposed_by: str | None = None
    problems: tuple[str, ...] = ()  # activations and approvals on the chain that count for nothing
    counted: tuple[int, ...] = ()  # the versions that governed in turn, this one last
    eras: Eras = ()  # which policy governed from which event on (keyring.Eras), this one last

    @property
    def version(self) -> int:
        return self.policy.version or 0

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "sha256": self.policy.sha256, "source": self.policy.source,
                "proposed_by": self.proposed_by, "approved_by": list(self.approved_by),
                "activated_at": self.activated_at.isoformat(timespec="seconds") + "Z" if self.activated_at else None,
                "not_counted": list(self.problems)}


def record_source(version: int) -> str:
    return f"policy of record v{version}" if version else "built-in default (no policy of record yet)"


def change_rule(policy: Policy) -> EnvironmentPolicy:
    """Who must sign a change of ``policy``: the same four-eyes as a production promotion (its
    ``production`` environment, else its strictest environment that needs approval), and never
    less than one person other than the proposer."""
    needing = [env for env in policy.environments.values() if env.approval_required]
    env = policy.environments.get("production")
    if env is None or not env.approval_required:
        env = max(needing, key=lambda e: e.approvals_required, default=None)
    if env is None:
        return EnvironmentPolicy(name="policy", golden_set="", required_checks=(), allow_warnings=False,
                                 approval_required=True, approvers=(), acceptance_tolerance=0.0,
                                 max_validation_age_days=None)
    return replace(env, approval_required=True)


def unchangeable(policy: Policy) -> str | None:
    """Why no change of ``policy`` could ever be approved once it governs (naming the field), or
    None. Such a policy would govern for good: refused when proposed and when approved."""
    if not policy.enrollers:
        return ("keyring.enrollers = []: nobody could enrol an approver's key, so no signature would count "
                "and no later policy change could be approved")
    rule = change_rule(policy)
    people = set(rule.approvers)  # normalised when parsed: one spelling per person
    if people and len(people) < rule.approvals_required:
        return (f"environments.{rule.name} names {len(people)} approver(s) but approvals_required = "
                f"{rule.approvals_required}: no later policy change (signed as a {rule.name} promotion) could "
                f"ever be approved")
    return None


def rule_text(policy: Policy) -> str:
    rule = change_rule(policy)
    who = f" from {', '.join(rule.approvers)}" if rule.approvers else ""
    count = "1 approval" if rule.approvals_required == 1 else f"{rule.approvals_required} approvals"
    return f"{count}{who} by someone other than the proposer (the rule of {policy.source})"


def parsed(row: PolicyDocument) -> Policy:
    return replace(parse_policy_text(row.document, row.format, record_source(row.version)), version=row.version)


def judge(session: Session, row: PolicyDocument | None, approvals: list[AuditEvent], current: Policy,
          chain: list[AuditEvent], eras: Eras, before: int | None = None) -> tuple[Policy | None, Tally | None, str | None]:
    """Whether policy ``row`` may replace ``current`` at the chain's event ``before`` (None: now):
    (its Policy, the tally of its approvals, None) or (None, the tally if one was made, why not).
    Only the approvals between its proposal and that point count, with the keyring as it stood
    at that point (``eras``: which policy governed when, up to it): a key revoked later takes
    nothing back from a change already in effect, which only another four-eyes change undoes."""
    if row is None:
        return None, None, "no such proposed policy in the registry"
    proposal = next((e for e in chain if e.event_hash == row.event_hash and e.action == PROPOSE
                     and (before is None or e.id < before)), None)
    details = (proposal.details or {}) if proposal is not None else {}
    if proposal is None or details.get("policy_version") != row.version or details.get("sha256") != row.sha256 \
            or details.get("document_sha256") != sha256_hex(row.document.encode("utf-8")) \
            or not same_user(proposal.actor, row.proposed_by):
        return None, None, "its proposal event is missing from the verified audit chain or does not match the row"
    if not written_by_its_actor(proposal):
        return None, None, f"its proposal event says {proposal.actor} but database role {proposal.session_role} wrote it"
    try:
        policy = parsed(row)
    except UsageError as exc:
        return None, None, f"its document no longer parses ({exc})"
    if policy.sha256 != row.sha256:
        return None, None, "its document no longer says what was proposed (hash differs)"
    keyring, _ = keyring_entries(session, current, [e for e in chain if before is None or e.id < before], eras)
    decisions, refused = [], []
    for event in (e for e in approvals if e.id > proposal.id and (before is None or e.id < before)):
        signer = event.actor
        try:
            if not written_by_its_actor(event):
                raise ValueError(f"its event says {event.actor} but database role {event.session_role} wrote it")
            signed = check_decision((event.details or {}).get("signature"), keyring, pair=POLICY_SUBJECT,
                                    version=row.version, binding_sha256=row.sha256,
                                    predicate_type=POLICY_PREDICATE_TYPE)
            if not same_user(signed.approver, event.actor):
                raise ValueError(f"its signature names {signed.approver}")
            if signed.predicate.get("policy_sha256") != current.sha256:
                raise ValueError("signed under another policy than the one in effect")
        except ValueError as exc:
            refused.append(f"approval by {signer}: {exc}")
            continue
        # ordered by when the registry recorded it, never by the signer's own clock
        decisions.append(replace(signed, signed_at=event.created_at))
    rule = change_rule(current)
    result = tally(decisions, registrant=row.proposed_by, approvers=rule.approvers, scope=None,
                   threshold=rule.approvals_required, what=f"policy v{row.version}")
    if not result.passed:
        return None, result, result.reason + ("; not counted: " + "; ".join(refused) if refused else "")
    return policy, result, None


def replay(session: Session, chain: list[AuditEvent] | None = None) -> PolicyRecord:
    """The policy of record, replayed from the verified audit chain (see the module's text)."""
    if chain is None:
        chain, _ = verified_chain(session)
    rows = {row.version: row for row in policy_versions.policy_documents(session)}
    current = replace(builtin_policy(), version=0, source=record_source(0))
    record = PolicyRecord(current, eras=((0, current),))
    problems: list[str] = []
    approvals: dict[int, list[AuditEvent]] = defaultdict(list)
    for event in chain:
        if event.action not in (APPROVE, ACTIVATE):
            continue
        version = (event.details or {}).get("policy_version")
        if not isinstance(version, int) or isinstance(version, bool):
            problems.append(f"event {event.id}: names no policy version")
        elif event.action == APPROVE:
            approvals[version].append(event)
        elif version <= record.version:
            problems.append(f"policy v{version}: activated after v{record.version}, which replaced it")
        else:
            policy, result, why = judge(session, rows.get(version), approvals[version], current, chain,
                                        record.eras, event.id)
            if policy is None:
                problems.append(f"policy v{version}: activation does not count: {why}")
                continue
            current = policy
            record = PolicyRecord(policy, event.created_at, result.approvers, rows[version].proposed_by,
                                  counted=record.counted + (version,), eras=record.eras + ((event.id, policy),))
    return replace(record, problems=tuple(problems))


def policy_of_record(store: Store) -> PolicyRecord:
    """The policy that governs ``store`` now."""
    with store.session() as session:
        return replay(session)


def propose(store: Store, path: str, *, actor: str, note: str | None = None) -> dict[str, Any]:
    """Record the policy in the file ``path`` as the next proposed version (nothing governs by
    it until it is approved). Returns what `specreg policy propose` prints."""
    actor = normalize_user(actor, what="proposer")
    text, policy_format = read_policy_file(path)
    policy = parse_policy_text(text, policy_format, str(path))  # a malformed file is refused here
    if (problem := unchangeable(policy)) is not None:
        raise UsageError(f"policy file {path}: {problem}")
    with store.session(write=True) as session:
        chain, problem = verified_chain(session)
        if problem is not None:
            raise SpecregError(f"cannot propose a policy: the audit chain does not verify ({problem})")
        record = replay(session, chain)
        if policy.sha256 == record.policy.sha256:
            raise UsageError(f"policy file {path} says what {record.policy.source} already says: nothing to propose")
        row = policy_versions.add_policy_document(session, document=text, format=policy_format,
                                                  sha256=policy.sha256, proposed_by=actor, proposed_at=utcnow(),
                                                  note=note)
        version = row.version
        store.append_event(session, pair_name=POLICY_EVENT_PAIR, version=None, action=PROPOSE, from_state=None,
                           to_state=None, actor=actor, reason=note,
                           details={"policy_version": version, "sha256": policy.sha256,
                                    "document_sha256": sha256_hex(text.encode("utf-8")), "file": str(path),
                                    "replaces": record.version})
        policy_versions.mark_recorded(session, row.id, store.head_hash(session))
        return {"version": version, "sha256": policy.sha256, "replaces": record.version,
                "needs": rule_text(record.policy)}


def approve(store: Store, version: int, *, actor: str, key: str, note: str | None = None) -> dict[str, Any]:
    """Sign ``actor``'s approval of proposed policy ``version`` with the private key file ``key``
    (enrolled to ``actor``; never the proposer). When the approvals meet the rule of the policy
    in effect, the proposed version becomes the policy of record in the same transaction."""
    # one change at a time: the audit head is held throughout
    with signed_write(store, actor=actor, key=key, what="approve a policy", lock=store.lock_audit_head) as write:
        session, actor, kid = write.session, write.actor, write.key_id
        record = replay(session, write.chain)
        row = policy_versions.policy_document(session, version)
        if row is None:
            raise NotFoundError(f"unknown policy version {version} (`specreg policy history` lists them)")
        if version <= record.version:
            raise PolicyViolation(f"policy v{version} is not pending: {record.policy.source} governs now")
        if same_user(actor, row.proposed_by):
            raise PolicyViolation(f"four-eyes: {actor} proposed policy v{version} and cannot approve it")
        if (problem := unchangeable(parsed(row))) is not None:
            raise PolicyViolation(f"policy v{version} could never be changed again once in effect: {problem}; "
                                  f"propose another")
        rule = change_rule(record.policy)
        if rule.approvers and not any(same_user(actor, a) for a in rule.approvers):
            raise PolicyViolation(f"{actor} may not approve policy changes: {record.policy.source} asks for "
                                  f"{', '.join(rule.approvers)}")
        write.enrolled(record.policy)
        now = utcnow()
        predicate = approval_predicate(pair=POLICY_SUBJECT, version=version, binding_sha256=row.sha256,
                                       decision=APPROVED, scope=ANY_SCOPE, policy_sha256=record.policy.sha256,
                                       validation_run=None, approver=actor, signed_at=now, note=note)
        store.append_event(session, pair_name=POLICY_EVENT_PAIR, version=None, action=APPROVE, from_state=None,
                           to_state=None, actor=actor, reason=note,
                           details={"policy_version": version, "sha256": row.sha256, "key_id": kid,
                                    "under_policy_version": record.version,
                                    "signature": sign_decision(write.signer, predicate, POLICY_PREDICATE_TYPE)})
        session.flush()
        chain, _ = verified_chain(session)
        approvals = [e for e in chain if e.action == APPROVE and (e.details or {}).get("policy_version") == version]
        policy, result, why = judge(session, row, approvals, record.policy, chain, record.eras)
        if policy is not None:
            store.append_event(session, pair_name=POLICY_EVENT_PAIR, version=None, action=ACTIVATE, from_state=None,
                               to_state=None, actor=actor, reason=None,
                               details={"policy_version": version, "sha256": row.sha256,
                                        "replaces": record.version, "approved_by": list(result.approvers)})
        return {"version": version, "approved_by": actor, "active": policy is not None,
                "standing": why or result.reason, "governs": record_source(version if policy else record.version)}


def history(store: Store) -> list[dict[str, Any]]:
    """Every proposed policy version, oldest first: who proposed it, its approvals, and whether
    it governs now, governed earlier, is pending or was passed over."""
    with store.session() as session:
        chain, _ = verified_chain(session)
        record = replay(session, chain)
        approvers: dict[int, list[str]] = defaultdict(list)
        for event in chain:
            if event.action == APPROVE:
                approvers[(event.details or {}).get("policy_version")].append(event.actor)
        listed = []
        for row in policy_versions.policy_documents(session):
            if row.version == record.version:
                state = "in effect"
            elif row.version in record.counted:
                state = "superseded"
            elif row.version > record.version:
                state = "pending"
            else:
                state = "passed over"
            listed.append({"version": row.version, "sha256": row.sha256, "proposed_by": row.proposed_by,
                           "proposed_at": row.proposed_at.isoformat(timespec="seconds") + "Z", "note": row.note,
                           "approved_by": approvers.get(row.version, []), "state": state})
        return listed


def document(store: Store, version: int) -> str:
    """The text of policy ``version`` as proposed."""
    with store.session() as session:
        row = policy_versions.policy_document(session, version)
        if row is None:
            raise NotFoundError(f"unknown policy version {version} (`specreg policy history` lists them)")
        return row.document

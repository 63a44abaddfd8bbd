"""Which engine baselines count, and accepting one whose acceptance differs from our runtime's.

An engine baseline (registry/store/engine_baselines.py) is what exports, alert rules, observe
and the policy's ``required_engine_baselines`` compare with, so a figure an engine reported
counts only when nobody could have slipped it in:

- its ``engine_validate`` audit event is in the verified chain, written (PostgreSQL) by its
  actor's role, and carries the row's content hash: a row inserted or edited with the printed
  ``db grants`` and no such event counts for nothing;
- it was measured on the version's current binding;
- it ``passed``, or it is ``unaccepted`` (its acceptance rate differs from our runtime's on the
  same pair by more than ``PARITY_TOLERANCE``, whatever ``--parity-tolerance`` the run was given)
  and an approver accepted it: a signature, made as approvals are (governance/signatures.py), by
  a key the keyring enrols to someone who neither registered the pair nor ran that engine
  validation, and whom neither of them enrolled, over the baseline's content hash, recorded in
  an ``engine_accept`` audit event.

A failed engine baseline (impossible counts, outputs that differ in the engine) cannot be
accepted: the engine is re-validated instead. Which of the three an engine validation records is
``baseline_status``'s rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specreg.core.statuses import PARITY_TOLERANCE
from specreg.core.types import FAIL
from specreg.core.user_names import same_user
from specreg.errors import NotFoundError, PolicyViolation, UsageError
from specreg.registry.store.engine_baselines import (FAILED, PASSED, UNACCEPTED, baseline_of, baselines_of,
                                                     content_sha256)
from specreg.registry.store.entities import AuditEvent, EngineBaseline, PairVersion
from specreg.registry.store.store import Session, verified_chain

ACCEPT_ACTION = "engine_accept"
VALIDATE_ACTION = "engine_validate"
ACCEPT_PREDICATE = "https://specreg.dev/engine-baseline-acceptance/v1"


@dataclass(frozen=True)
class Standing:
    """One engine baseline as the registry judges it now."""

    row: EngineBaseline
    counts: bool
    why: str  # passed / accepted by NAME / unaccepted ... / failed ... / not on the chain ...
    accepted_by: str | None = None
    on_chain: bool = True  # its engine_validate event is in the verified chain and says the same

    def to_dict(self) -> dict[str, Any]:
        return {"engine_baseline_id": self.row.id, "engine": self.row.engine, "status": self.row.status,
                "counts": self.counts, "why": self.why, "accepted_by": self.accepted_by, "on_chain": self.on_chain}


def baseline_status(checks, parity_tolerance: float) -> tuple[str, str | None]:
    """An engine validation's checks (core.types.CheckResult) and the parity tolerance it was given
    -> (passed | failed | unaccepted, why it needs acceptance or None). A check other than parity
    failing fails the baseline. An acceptance rate beyond the parity tolerance, the run's or, when
    the run was given a looser one, the registry's own (PARITY_TOLERANCE), makes it unaccepted:
    recorded, used by nothing until an approver accepts it."""
    if any(check.status == FAIL and check.name != "engine_parity" for check in checks):
        return FAILED, None
    parity = next((check for check in checks if check.name == "engine_parity"), None)
    if parity is None:
        return PASSED, None
    tolerance = min(parity_tolerance, PARITY_TOLERANCE)
    delta = (parity.figures or {}).get("alpha_delta")
    if parity.status == FAIL or (delta is not None and delta > tolerance):
        alpha = (parity.figures or {})
        if delta is not None and delta <= tolerance:  # overall within: a category failed it
            shown = parity.summary
        else:
            shown = (f"alpha {alpha['alpha_engine']:.4f} in the engine vs {alpha['alpha_ours']:.4f} on our runtime "
                     f"(|d| {delta:.4f} > {tolerance:g})" if delta is not None else "no acceptance to compare")
        return UNACCEPTED, shown
    return PASSED, None


def judge(session: Session, version_row: PairVersion, rows: list[EngineBaseline], chain: list[AuditEvent],
          keyring: dict) -> list[Standing]:
    """Each of ``rows`` (baselines of ``version_row``) with whether it counts and why."""
    from specreg.registry.governance.keyring import written_by_its_actor

    label = version_row.label
    recorded: dict[int, AuditEvent] = {}
    acceptances: dict[int, list[AuditEvent]] = {}
    for event in chain:
        if event.pair_name != version_row.name or event.version != version_row.version:
            continue
        baseline_id = (event.details or {}).get("engine_baseline_id")
        if event.action == VALIDATE_ACTION and written_by_its_actor(event):
            recorded.setdefault(baseline_id, event)
        elif event.action == ACCEPT_ACTION and written_by_its_actor(event):
            acceptances.setdefault(baseline_id, []).append(event)
    judged = []
    for row in rows:
        digest = content_sha256(row)
        event = recorded.get(row.id)
        if event is None or (event.details or {}).get("content_sha256") != digest \
                or not same_user(event.actor, row.actor):
            judged.append(Standing(row, False, f"engine baseline {row.id} has no matching {VALIDATE_ACTION} event in "
                                               f"the verified audit chain (written outside specreg, or edited)",
                                   on_chain=False))
        elif row.binding_sha256 != version_row.binding_sha256:
            judged.append(Standing(row, False, f"engine baseline {row.id} was measured on another binding of {label}"))
        elif row.status == PASSED:
            judged.append(Standing(row, True, "passed"))
        elif row.status == UNACCEPTED:
            approver, problems = None, []
            for accept_event in acceptances.get(row.id, []):
                try:
                    approver = check_acceptance(accept_event, row, version_row, keyring, digest)
                    break
                except ValueError as exc:
                    problems.append(str(exc))
            if approver is not None:
                judged.append(Standing(row, True, f"accepted by {approver}", approver))
            else:
                reason = (row.report or {}).get("acceptance_reason") or "its acceptance differs from our runtime's"
                tried = f" (acceptances that do not count: {'; '.join(problems)})" if problems else ""
                judged.append(Standing(row, False, f"engine baseline {row.id} is unaccepted: {reason}; it counts once "
                                                   f"an approver accepts it: `specreg engine-baselines accept {label} "
                                                   f"{row.id} --key FILE`{tried}"))
        else:
            reason = (row.report or {}).get("reason") or "see the baseline"
            judged.append(Standing(row, False, f"engine baseline {row.id} {row.status}: {reason}"))
    return judged


def check_acceptance(event: AuditEvent, row: EngineBaseline, version_row: PairVersion, keyring: dict,
                     digest: str) -> str:
    """The approver of one ``engine_accept`` event once its signature verifies with a key the
    keyring enrols to them and says what the row is now; ValueError with the reason otherwise."""
    from specreg.core.signing import bundle_key_id, verified_statement

    details = event.details or {}
    bundle = details.get("signature")
    kid = bundle_key_id(bundle)
    entry = keyring.get(kid) if kid else None
    if entry is None:
        raise ValueError(f"acceptance by {event.actor}: signed with a key the keyring does not enrol")
    statement = verified_statement(bundle, entry.public_key, ACCEPT_PREDICATE)
    predicate = statement.get("predicate") or {}
    expected = {"pair": version_row.name, "version": str(version_row.version),
                "binding_sha256": version_row.binding_sha256, "engine_baseline_id": str(row.id),
                "content_sha256": digest}
    if any(predicate.get(key) != value for key, value in expected.items()):
        raise ValueError(f"acceptance by {event.actor}: its signature is about another baseline or content")
    approver = str(predicate.get("approver"))
    if not same_user(approver, entry.person) or not same_user(event.actor, entry.person):
        raise ValueError(f"acceptance by {event.actor}: signed with {entry.person}'s key")
    problem = four_eyes_problem(approver, entry.enrolled_by, version_row, row)
    if problem is not None:
        raise ValueError(f"acceptance by {approver}: {problem}")
    return entry.person


def four_eyes_problem(approver: str, enroller: str, version_row: PairVersion, row: EngineBaseline) -> str | None:
    """Why ``approver``, with a key ``enroller`` enrolled, may not accept baseline ``row``, or None.
    As for a pair's approval: neither the registrant nor whoever ran the engine validation, and
    no key either of them enrolled (an enroller could enrol a key for an invented person)."""
    for person, did in ((version_row.registered_by, f"registered {version_row.label}"),
                        (row.actor, f"ran engine validation {row.id}")):
        if same_user(approver, person):
            return f"four-eyes: {approver} {did} and cannot accept it"
        if same_user(enroller, person):
            return (f"four-eyes: {approver}'s key was enrolled by {enroller}, who {did}: another enroller must "
                    f"enrol it")
    return None


def counted_rows(session: Session, version_row: PairVersion, engine: str, policy,
                 chain: list[AuditEvent] | None = None) -> list[Standing]:
    """Every baseline of ``engine`` for ``version_row``, newest first, each judged (judge)."""
    from specreg.registry.governance.keyring import keyring_entries

    if chain is None:
        chain, _ = verified_chain(session)
    keyring, _ = keyring_entries(session, policy, chain)
    rows = baselines_of(session, version_row, engine, newest_first=True)
    return judge(session, version_row, rows, chain, keyring)


def newest_counted(store, policy, name: str, version: int, engine: str):
    """The newest engine baseline of ``engine`` for ``name@version`` that counts (an
    engine_baselines.EngineBaseline), or None: what exports, alert rules and observe use."""
    with store.session() as session:
        version_row = store.pair_version(session, name, version)
        for standing in counted_rows(session, version_row, engine, policy):
            if standing.counts:
                return standing.row
    return None


def standings(store, policy, name: str, version: int) -> list[Standing]:
    """Every engine baseline of ``name@version``, oldest first, judged."""
    from specreg.registry.governance.keyring import keyring_entries

    with store.session() as session:
        version_row = store.pair_version(session, name, version)
        chain, _ = verified_chain(session)
        keyring, _ = keyring_entries(session, policy, chain)
        return judge(session, version_row, baselines_of(session, version_row), chain, keyring)


def accept(store, policy, name: str, version: int, baseline_id: int, *, actor: str, key: str,
           note: str | None = None) -> Standing:
    """Sign and record ``actor``'s acceptance of the unaccepted engine baseline ``baseline_id`` of
    ``name@version`` with the private key file ``key`` (enrolled to ``actor``), with its audit
    event. PolicyViolation for a key not enrolled to ``actor``, the pair's registrant, whoever ran
    the engine validation, a key either of them enrolled, a baseline not on the chain, not on the current binding, failed, or
    one that counts already."""
    from specreg.core.signing import sign_statement
    from specreg.registry.governance.signed_writes import signed_write, version_lock
    from specreg.registry.store.store import utcnow

    label = f"{name}@{version}"

    with signed_write(store, actor=actor, key=key, what=f"accept an engine baseline of {label}",
                      lock=version_lock(store, name, version)) as write:
        session, actor, version_row, kid = write.session, write.actor, write.locked, write.key_id
        keyring = write.enrolled(policy)
        row = baseline_of(session, version_row, baseline_id)
        if row is None:
            raise NotFoundError(f"{label} has no engine baseline {baseline_id}")
        standing = judge(session, version_row, [row], write.chain, keyring)[0]
        if standing.counts:
            raise UsageError(f"engine baseline {baseline_id} of {label} counts already ({standing.why})")
        if row.status == FAILED:
            raise PolicyViolation(f"engine baseline {baseline_id} of {label} failed "
                                  f"({(row.report or {}).get('reason') or 'see the baseline'}): only an unaccepted "
                                  f"one (acceptance beyond the parity tolerance) can be accepted; validate again")
        if row.status != UNACCEPTED:
            raise PolicyViolation(standing.why)
        problem = four_eyes_problem(actor, keyring[kid].enrolled_by, version_row, row)
        if problem is not None:
            raise PolicyViolation(problem)
        digest = content_sha256(row)
        predicate = {"pair": name, "version": str(version), "binding_sha256": version_row.binding_sha256,
                     "engine_baseline_id": str(row.id), "content_sha256": digest, "approver": actor,
                     "signed_at": utcnow().isoformat(timespec="microseconds"), "policy_sha256": policy.sha256,
                     "note": note}
        bundle = sign_statement(write.signer, subject_name=label, subject_sha256=version_row.binding_sha256,
                                predicate_type=ACCEPT_PREDICATE, predicate=predicate)
        store.append_event(session, pair_name=name, version=version, action=ACCEPT_ACTION,
                           from_state=version_row.state.value, to_state=version_row.state.value, actor=actor,
                           reason=note,
                           details={"engine_baseline_id": row.id, "engine": row.engine, "content_sha256": digest,
                                    "key_id": kid, "policy_sha256": policy.sha256, "signature": bundle})
        return Standing(row, True, f"accepted by {actor}", actor)

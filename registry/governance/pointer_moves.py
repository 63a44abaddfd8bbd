"""Moving environment pointers: promote under a policy, rollback, retire, and what a version
that loses an environment returns to.

Every state change here is one transaction (``Store.session(write=True)``): the pair row is
locked first (SELECT ... FOR UPDATE on PostgreSQL; BEGIN IMMEDIATE already serialises writers
on SQLite), then the environment pointer, so two promotes of one pair queue; a promote also
carries the holder it saw when it started (compare-and-set), so of two racing promotes
exactly one wins and the other gets ConcurrentUpdateError with nothing changed. Slow work
(re-fingerprinting the models; loading the golden set, which the calling command resolves)
happens before the transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specreg.errors import ConcurrentUpdateError, IllegalTransitionError, NotFoundError, PolicyViolation
from specreg.registry.governance.approvals import export_environment, rejected_by, standing
from specreg.registry.governance.decisions import evaluate, unmet
from specreg.registry.governance.environment_history import new_holder
from specreg.registry.governance.floors import SPEEDUP_EXCEPTION
from specreg.registry.governance.policy import Policy
from specreg.registry.governance.queries import fingerprint_changes, pointer_problem
from specreg.registry.store import pointers
from specreg.registry.store.entities import PairState, PairVersion
from specreg.registry.store.store import Session, Store, utcnow, verified_chain

if TYPE_CHECKING:
    from specreg.golden_prompts.records import GoldenRef

UNCHANGED = "unchanged"


@dataclass(frozen=True)
class PointerMove:
    """What a promote or rollback did to one environment pointer."""

    pair: str
    environment: str
    version: int  # the new holder
    previous_version: int | None  # the holder it replaced
    action: str  # promote | rollback | unchanged (a promote of the version that already held it)
    exception: dict[str, Any] | None = None  # a promote's recorded exception to min_speedup

    def to_dict(self) -> dict[str, Any]:
        return {"pair": self.pair, "environment": self.environment, "version": self.version,
                "previous_version": self.previous_version, "action": self.action,
                **({"exception": self.exception} if self.exception else {})}


def release(store: Store, policy: Policy, session: Session, row: PairVersion, *, actor: str, environment: str,
            replaced_by: int | None, reason: str | None) -> None:
    """A version lost ``environment``: when it holds no other environment its state returns
    to approved (validated unless its signed approvals stand), with an audit event."""
    if pointers.holds_another(session, row, environment) or row.state is not PairState.PROMOTED:
        return
    chain, _ = verified_chain(session)
    approved = standing(session, row, export_environment(policy), policy, chain)[0].passed
    store.transition(row.name, row.version, PairState.APPROVED if approved else PairState.VALIDATED,
                     actor=actor, action="release", reason=reason,
                     details={"environment": environment, "replaced_by": replaced_by}, session=session)


def promote(store: Store, policy: Policy, name: str, version: int, environment: str, *, golden: GoldenRef,
            actor: str, expected_holder: int | None, reason: str | None = None,
            allow_slower: str | None = None) -> PointerMove:
    """Make ``name@version`` the holder of ``environment`` if the policy allows it; ``golden``: the
    environment's golden set as the command resolved it (queries.golden_reference).

    ``expected_holder``: the version number (None: nobody) the caller saw holding the
    environment; if another promote moved the pointer since, ConcurrentUpdateError and nothing
    changes. Refusals raise PolicyViolation naming every failed condition. The pointer, the
    previous holder, the state moves and the audit events are one transaction. ``allow_slower``:
    why a version whose measured speedup is below the policy's min_speedup may hold it anyway
    (recorded in the promote's audit event as an exception; every other condition still applies)."""
    env = policy.environment(environment)
    version_entity = store.get_version(name, version)
    changes = fingerprint_changes(version_entity)
    label = f"{name}@{version}"
    with store.session(write=True) as session:
        store.lock_pair(session, name)
        row = store.pair_version(session, name, version, lock=True)
        pointer = pointers.pointer(session, name, environment, lock=True)
        holder_version = pointer.version if pointer else None
        holder = store.pair_version(session, name, holder_version) if holder_version is not None else None
        if holder_version != expected_holder:
            raise ConcurrentUpdateError(
                f"{name}@{environment} is now held by {describe_holder(holder_version)} (moved by {pointer.updated_by} "
                f"at {pointer.updated_at.isoformat(timespec='seconds')}), not {describe_holder(expected_holder)} as when "
                f"this promote started: nothing changed")
        if holder is not None and holder.id == row.id and already_held(session, pointer):
            # a pipeline's re-run of a promotion that is done: nothing to change, nothing to record
            return PointerMove(name, environment, version, holder_version, UNCHANGED)
        stale_policy(session, policy)
        conditions, run = evaluate(session, row, env, policy, golden=golden, changes=changes, holder=holder,
                                   now=utcnow())
        # an exception waives a measured speedup below the floor, never a speedup not measured
        excepted = next((c for c in conditions if c.name == SPEEDUP_EXCEPTION and not c.passed
                         and "speedup" in c.details), None) if allow_slower else None
        exception = {"condition": SPEEDUP_EXCEPTION, "reason": allow_slower, **excepted.details} if excepted else None
        failed = [c for c in conditions if not c.passed and c is not excepted]
        if failed:
            judged = unmet(failed)  # never empty: an unjudged condition follows a failed one
            raise PolicyViolation(f"cannot promote {label} to {environment}: "
                                  + "; ".join(f"{c.name}: {c.reason}" for c in judged),
                                  reasons=[(c.name, c.reason) for c in judged])
        pointers.hold(session, name, environment, row, actor=actor, now=utcnow())
        approval = next((c.details.get("approval") for c in conditions if c.name == "approval"), None)
        store.transition(name, version, PairState.PROMOTED, actor=actor, action="promote", reason=reason,
                         details={"environment": environment, "previous_version": holder_version,
                                  "validation_run": run.id if run else None, "approval": approval,
                                  "policy": policy.source, "policy_version": policy.version,
                                  "policy_sha256": policy.sha256, **({"exception": exception} if exception else {})},
                         session=session)
        if holder is not None:
            release(store, policy, session, holder, actor=actor, environment=environment, replaced_by=version,
                    reason=f"{label} promoted to {environment}")
        return PointerMove(name, environment, version, holder_version, "promote", exception)


def already_held(session: Session, pointer) -> bool:
    """Whether the audit chain vouches for ``pointer`` (a row edited by hand holds nothing)."""
    chain, _ = verified_chain(session)
    return pointer_problem(pointer, chain) is None


def stale_policy(session: Session, policy: Policy) -> None:
    """ConcurrentUpdateError when the policy of record changed since ``policy`` was read."""
    from specreg.registry.governance.policy_record import replay

    now = replay(session).policy
    if policy.version is not None and (now.version, now.sha256) != (policy.version, policy.sha256):
        raise ConcurrentUpdateError(f"the policy of record changed while this ran ({policy.source} -> {now.source}): "
                                    f"nothing changed, run it again")


def describe_holder(version: int | None) -> str:
    return f"version {version}" if version is not None else "no version"


def rollback(store: Store, policy: Policy, name: str, environment: str, *, actor: str, reason: str | None = None) -> PointerMove:
    """Point ``environment`` back at the version that held it before, in one transaction.

    The rolled-back version releases the environment; the previous one becomes the holder. It
    is refused (PolicyViolation) when the previous one is retired or failed, when the latest
    decision on it is a rejection, or when its models changed since registration (re-hashed
    here, before the transaction). Afterwards no earlier holder is remembered: a second
    rollback is refused rather than flipping back to the version just rolled back."""
    seen_previous, changes = None, []
    with store.session() as session:
        pointer = pointers.pointer(session, name, environment)
        if pointer is not None:
            seen_previous = pointer.previous_version
    if seen_previous is not None:
        # slow (hashes every weight file): outside the transaction, re-checked against the pointer below
        changes = fingerprint_changes(store.get_version(name, seen_previous))
    with store.session(write=True) as session:
        store.lock_pair(session, name)
        pointer = pointers.pointer(session, name, environment, lock=True)
        if pointer is None:
            raise NotFoundError(f"no version of {name} has held environment {environment}")
        if pointer.previous_version is None:
            raise IllegalTransitionError(f"{name}@{environment}: no previous holder recorded to roll back to; "
                                         f"promote a version explicitly")
        previous = store.pair_version(session, name, pointer.previous_version, lock=True)
        if previous.version != seen_previous:
            raise ConcurrentUpdateError(f"{name}@{environment}: the previous holder changed while rolling back "
                                        f"(now {name}@{previous.version}): nothing changed, run it again")
        target = f"cannot roll back {name}@{environment} to {name}@{previous.version}"
        chain, _ = verified_chain(session)
        problem = pointer_problem(pointer, chain)
        if problem is not None:
            raise PolicyViolation(f"{target}: {problem}")
        if not any(e.pair_name == name and new_holder(e, environment) == (True, previous.version) for e in chain):
            raise PolicyViolation(f"{target}: the audit chain has no promote of it to {environment} (the pointer row's "
                                  f"previous holder was written outside specreg)")
        if previous.state in (PairState.RETIRED, PairState.FAILED):
            raise PolicyViolation(f"{target}: it is {previous.state.value}")
        rejecter = rejected_by(session, previous, policy)
        if rejecter is not None:
            raise PolicyViolation(f"{target}: it was rejected by {rejecter} (signed)")
        if changes:
            raise PolicyViolation(f"{target}: its models changed since registration: {', '.join(changes)}")
        current_version = pointer.version
        current = store.pair_version(session, name, current_version) if current_version is not None else None
        pointers.restore_previous(session, name, environment, actor=actor, now=utcnow())
        store.transition(name, previous.version, PairState.PROMOTED, actor=actor, action="rollback", reason=reason,
                         details={"environment": environment, "previous_version": current_version}, session=session)
        if current is not None:
            release(store, policy, session, current, actor=actor, environment=environment, replaced_by=previous.version,
                    reason=f"rolled back to {name}@{previous.version}")
        return PointerMove(name, environment, previous.version, current_version, "rollback")


def retire(store: Store, name: str, version: int, *, actor: str, reason: str | None = None,
           force: bool = False) -> PairVersion:
    """Retire ``name@version``. Refused (PolicyViolation) while it holds an environment unless
    ``force``: then those environments are left without a holder (``rollback`` restores their
    previous one)."""
    label = f"{name}@{version}"
    with store.session(write=True) as session:
        store.lock_pair(session, name)
        row = store.pair_version(session, name, version, lock=True)
        environments = pointers.held_by(session, row)
        if environments and not force:
            raise PolicyViolation(f"{label} holds {', '.join(environments)}: roll back or promote another version "
                                  f"first, or retire with --force")
        # a retired version holds nothing and can no longer be a rollback target
        pointers.let_go(session, row, actor=actor, now=utcnow())
        return store.transition(name, version, PairState.RETIRED, actor=actor, action="retire", reason=reason,
                                details={"released": environments, "force": force}, session=session)


def environment_pointers(store: Store, name: str | None = None) -> list[dict[str, Any]]:
    """Every environment pointer (of one pair or all): holder and previous holder. A row the
    audit chain does not vouch for shows no holder and says why (``not_counted``)."""
    with store.session() as session:
        chain, _ = verified_chain(session)
        if name is not None and not store.has_pair(session, name):
            raise NotFoundError(f"unknown pair {name}")
        listed = []
        for p in pointers.pointers_of(session, name):
            problem = pointer_problem(p, chain)
            listed.append({"pair": p.pair, "environment": p.environment,
                           "version": None if problem else p.version,
                           "previous_version": None if problem else p.previous_version,
                           "updated_by": p.updated_by, "updated_at": p.updated_at.isoformat(timespec="seconds"),
                           **({"not_counted": problem} if problem else {})})
        return listed

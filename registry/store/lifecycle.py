"""The lifecycle of a pair version: which state moves are legal.

registered -> validated | failed -> approved -> promoted(env) -> retired. A version can be
validated again (its figures move to the new run), and any state but retired can retire.
"""

from __future__ import annotations

from specreg.errors import IllegalTransitionError
from specreg.registry.store.entities import PairState

S = PairState

ALLOWED_TRANSITIONS: dict[PairState, frozenset[PairState]] = {
    S.REGISTERED: frozenset({S.VALIDATED, S.FAILED, S.RETIRED}),
    # validated -> promoted: an environment whose policy needs no approval (e.g. staging)
    S.VALIDATED: frozenset({S.VALIDATED, S.FAILED, S.APPROVED, S.PROMOTED, S.RETIRED}),
    S.FAILED: frozenset({S.VALIDATED, S.FAILED, S.RETIRED}),
    # an approved version may be re-validated; a failing re-validation withdraws the approval
    S.APPROVED: frozenset({S.APPROVED, S.PROMOTED, S.VALIDATED, S.FAILED, S.RETIRED}),
    # promoted to another environment, or back to approved (validated, if it was never
    # approved) when no environment holds it any more
    S.PROMOTED: frozenset({S.PROMOTED, S.APPROVED, S.VALIDATED, S.FAILED, S.RETIRED}),
    S.RETIRED: frozenset(),
}


def check_transition(label: str, current: PairState, target: PairState) -> None:
    """Raise IllegalTransitionError unless ``current -> target`` is a legal move."""
    if target not in ALLOWED_TRANSITIONS[current]:
        allowed = ", ".join(sorted(s.value for s in ALLOWED_TRANSITIONS[current])) or "none"
        raise IllegalTransitionError(
            f"{label}: cannot move from {current.value} to {target.value} (allowed: {allowed})"
        )

"""Which version of a pair held an environment when (`specreg env history`), read from the
audit log: the only events that move an environment pointer are promote and rollback (a new
holder) and a forced retire (the environment left empty), each recording the environment.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from specreg.errors import UsageError
from specreg.registry.store.entities import AuditEvent
from specreg.registry.store.store import Store


@dataclass(frozen=True)
class Tenure:
    """One span during which ``version`` (None: no version) held an environment."""

    pair: str
    environment: str
    version: int | None
    since: datetime  # naive UTC, as stored
    until: datetime | None  # None: still holds it
    action: str  # promote | rollback | retire: the event that started the span
    actor: str
    reason: str | None
    event_id: int

    def to_dict(self) -> dict[str, Any]:
        return {"pair": self.pair, "environment": self.environment, "version": self.version,
                "since": self.since.isoformat(timespec="seconds") + "Z",
                "until": self.until.isoformat(timespec="seconds") + "Z" if self.until else None,
                "action": self.action, "actor": self.actor, "reason": self.reason, "event": self.event_id}


def new_holder(event: AuditEvent, environment: str) -> tuple[bool, int | None]:
    """(whether ``event`` moved ``environment``'s pointer, the version it points at after)."""
    details = event.details or {}
    if event.action in ("promote", "rollback") and details.get("environment") == environment:
        return True, event.version
    if event.action == "retire" and environment in (details.get("released") or []):
        return True, None
    return False, None


def environment_history(store: Store, name: str, environment: str) -> list[Tenure]:
    """Every span of ``environment`` of pair ``name``, oldest first (empty: never held)."""
    tenures: list[Tenure] = []
    for event in store.history(name):
        moved, version = new_holder(event, environment)
        if not moved:
            continue
        if tenures:
            tenures[-1] = _ended(tenures[-1], event.created_at)
        tenures.append(Tenure(name, environment, version, event.created_at, None, event.action, event.actor,
                              event.reason, event.id))
    return tenures


def holder_at(tenures: list[Tenure], at: datetime) -> Tenure | None:
    """The span covering ``at`` (naive UTC), or None before the first promotion."""
    covering = [t for t in tenures if t.since <= at and (t.until is None or at < t.until)]
    return covering[-1] if covering else None


def parse_time(text: str) -> datetime:
    """An ISO 8601 time ("2026-12-01T10:00:00Z", "2026-12-01 10:00+02:00", "2026-12-01") ->
    naive UTC; without an offset it is read as UTC. UsageError otherwise."""
    try:
        parsed = datetime.fromisoformat(text.strip())
    except (ValueError, AttributeError):
        raise UsageError(f"invalid time {text!r}: use ISO 8601, e.g. 2026-12-01T10:00:00Z") from None
    if parsed.tzinfo is not None:
        try:
            parsed = parsed.astimezone(timezone.utc).replace(tzinfo=None)
        except OverflowError:  # 0001-01-01T00:00+14:00 is in year 0 in UTC, 9999-12-31T23:59-14:00 in 10000
            raise UsageError(f"invalid time {text!r}: outside the years 1 to 9999 once converted to UTC") from None
    return parsed


def _ended(tenure: Tenure, until: datetime) -> Tenure:
    return Tenure(tenure.pair, tenure.environment, tenure.version, tenure.since, until, tenure.action,
                  tenure.actor, tenure.reason, tenure.event_id)

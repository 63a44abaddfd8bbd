"""The approval tag on an MLflow model version: what specreg writes there from a signed decision,
and what a reviewer's tag in the UI says. A tag is never a decision: MLflow OSS
records no author for a tag, so ``approved:bob`` is a request naming bob, which counts once bob
has signed it with `specreg approve` (registry/review/replay.py shows "waiting for bob's
signature" until then)."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from specreg.core.user_names import normalize_user
from specreg.errors import IdentityError, UsageError
from specreg.registry.store.entities import PairVersion

APPROVAL_TAG = "specreg.approval"
APPROVAL_NOTE_TAG = "specreg.approval_note"
# Written by set_approval next to the approval tag; trusted only while it still describes the
# current tag values (a reviewer may change the tag in the UI afterwards).
APPROVAL_RECORD_TAG = "specreg.approval_record"
APPROVAL_STATUSES = ("approved", "rejected")


def _approval_record(status: str, note: str | None) -> dict[str, Any]:
    return {"status": status, "note": note or None}


class ApprovalTags:
    """The approval-tag methods of MlflowSync (which supplies find_model_version,
    _require_model_version, _translate_errors and client)."""

    def read_approval(self, pair_version: PairVersion) -> dict[str, Any] | None:
        """The reviewer's decision on ``pair_version``, read from its model-version tags.

        The tag ``specreg.approval`` is ``approved:<user>`` / ``rejected:<user>`` (naming who
        decides) or a bare ``approved`` / ``rejected`` (naming nobody). Returns None when there
        is no model version or no tag, else ``{"status": "approved"|"rejected"|None, "named":
        the normalised user in the tag or None, "note": str|None, "user": str|None, "time":
        datetime|None, "raw": the tag value, "problem": str|None}``. A value that is none of
        these (``LGTM``, a user name that is not a valid identity) has status None and says
        why in ``problem``: the caller warns and ignores it, it never fails a command.
        Open-source MLflow records neither who set a tag nor when, so ``user``/``time`` come
        from the record set_approval writes, and only while that record still matches the
        tags; a decision made in the UI has ``user`` None and ``time`` None."""
        model_version = self.find_model_version(pair_version)
        if model_version is None:
            return None
        tags = model_version.tags or {}
        raw = tags.get(APPROVAL_TAG)
        if raw is None or not raw.strip():
            return None
        note = (tags.get(APPROVAL_NOTE_TAG) or "").strip() or None
        result: dict[str, Any] = {"status": None, "named": None, "note": note, "user": None, "time": None,
                                  "raw": raw, "problem": None}
        status, _, named = raw.strip().partition(":")
        status = status.strip().lower()
        if status not in APPROVAL_STATUSES:
            result["problem"] = (f"{model_version.name} version {model_version.version}: tag {APPROVAL_TAG}="
                                 f"{raw!r} is not approved:<user> or rejected:<user>; ignored")
            return result
        if named.strip():
            try:
                result["named"] = normalize_user(named, what=f"tag {APPROVAL_TAG}")
            except IdentityError as exc:
                result["problem"] = f"{model_version.name} version {model_version.version}: {exc}; ignored"
                return result
        result["status"] = status
        try:
            record = json.loads(tags.get(APPROVAL_RECORD_TAG) or "null")
        except json.JSONDecodeError:
            record = None
        if isinstance(record, dict) and {
            "status": record.get("status"), "note": record.get("note")
        } == _approval_record(status, note) and record.get("user") == result["named"]:
            result["user"] = record.get("user")
            try:
                result["time"] = datetime.fromisoformat(record["time"]) if record.get("time") else None
            except (TypeError, ValueError):
                result["time"] = None
        return result

    def set_approval(
        self, pair_version: PairVersion, status: str, note: str | None, user: str
    ) -> None:
        """Write the decision as a reviewer would in the UI (tag ``specreg.approval`` =
        ``<status>:<user>``, ``specreg.approval_note``) plus a record of who and when.
        ``status``: approved or rejected. Raises NotFoundError when the version has no model
        version yet."""
        status = status.strip().lower()
        if status not in APPROVAL_STATUSES:
            raise UsageError(f"approval status {status!r} is not one of {', '.join(APPROVAL_STATUSES)}")
        model_version = self._require_model_version(pair_version)
        record = {
            **_approval_record(status, note),
            "user": user,
            "time": datetime.now(timezone.utc).isoformat(),
        }
        with self._translate_errors():
            name, version = model_version.name, model_version.version
            self.client.set_model_version_tag(name, version, APPROVAL_TAG, f"{status}:{user}")
            if note:
                self.client.set_model_version_tag(name, version, APPROVAL_NOTE_TAG, note)
            elif APPROVAL_NOTE_TAG in (model_version.tags or {}):
                self.client.delete_model_version_tag(name, version, APPROVAL_NOTE_TAG)
            self.client.set_model_version_tag(
                name, version, APPROVAL_RECORD_TAG, json.dumps(record, sort_keys=True)
            )

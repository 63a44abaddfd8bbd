"""Where two values first differ: token lists, texts, JSON values. The checks (tokenizer, chat
template, engine equivalence) report the first difference of what the draft and the target (or
the engine and our runtime) produced, found here the one way."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def first_difference(a: Sequence, b: Sequence) -> int | None:
    """The first position where two lists (or texts) differ (a length difference counts: the
    shorter length), or None when they are equal."""
    for position, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return position
    return None if len(a) == len(b) else min(len(a), len(b))


def first_json_difference(a: Any, b: Any, path: str = "") -> tuple[str, Any, Any] | None:
    """(dotted path, value in a, value in b) of the first difference of two JSON values."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            difference = first_json_difference(a.get(key), b.get(key), f"{path}.{key}" if path else str(key))
            if difference is not None:
                return difference
        return None
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for index, (x, y) in enumerate(zip(a, b)):
            difference = first_json_difference(x, y, f"{path}[{index}]")
            if difference is not None:
                return difference
        return None
    return None if a == b else (path or "(whole)", a, b)


def first_token_difference(draft_ids: list[int], target_ids: list[int], draft, target) -> dict | None:
    """First position where two id lists differ: position, id and token string of each side
    (``draft`` and ``target``: tokenizers, read through ``convert_ids_to_tokens`` only).

    A side that ended early shows id None and token "<end>". None when the lists are equal.
    """
    position = first_difference(list(draft_ids), list(target_ids))
    if position is None:
        return None
    draft_id = draft_ids[position] if position < len(draft_ids) else None
    target_id = target_ids[position] if position < len(target_ids) else None
    return {
        "position": position,
        "draft_id": draft_id,
        "target_id": target_id,
        "draft_token": "<end>" if draft_id is None else draft.convert_ids_to_tokens(draft_id),
        "target_token": "<end>" if target_id is None else target.convert_ids_to_tokens(target_id),
        "draft_length": len(draft_ids),
        "target_length": len(target_ids),
    }


def token_label(token: str | None, token_id: int | None) -> str:
    """A token as a message shows it: its text and id (the text alone where there is no id, as
    for the "<end>" of a side that ended early)."""
    return f"{token!r} (id {token_id})" if token_id is not None else repr(token)

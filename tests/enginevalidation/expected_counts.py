"""The loopback engine servers' schedule (scripted_target.py), counted here independently of it,
for the tests that check what specreg reads from them (test_engine_url.py, test_sglang_url.py)."""

from __future__ import annotations


def scripted(prompt_ids, max_tokens, k):
    """Accepted drafts per verify step of a prompt: j = (prompt length + step) mod (k + 1)."""
    emitted, accepted, step = 0, [], 0
    while emitted < max_tokens:
        j = (len(prompt_ids) + step) % (k + 1)
        accepted.append(j)
        emitted += j + 1
        step += 1
    return accepted

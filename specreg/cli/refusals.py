"""A refused promote or gate for people: one reason a line, each with the command that fixes it."""

from __future__ import annotations

import shlex

from specreg.errors import PolicyViolation


def fix_for(condition: str, label: str, environment: str, golden_set: str, reason: str = "") -> str | None:
    """The command (or step) that fixes failed gate condition ``condition`` (its ``reason``) of
    ``label`` (NAME@VERSION) for ``environment``; None when nothing can."""
    name = label.split("@")[0]
    ref, env = shlex.quote(label), shlex.quote(environment)
    validate = f"specreg validate {ref} --golden {shlex.quote(golden_set)}"
    register = f"specreg register {shlex.quote(name)} --target TARGET --draft DRAFT"
    if condition in ("validation", "golden_set", "validation_age", "baselines") or condition.startswith("check.") \
            or (condition == "speedup" and "measured no speedup" in reason):
        return validate
    return {
        "audit": "specreg audit verify (then restore the audit log from a backup)",
        "not_retired": f"{register} (a retired version stays retired: register a new one)",
        "fingerprints": f"{register} (the models changed since registration: register them as a new version)",
        "acceptance": f"{validate} (or register a draft closer to the target: {register})",
        "min_acceptance": f"{register} (a draft closer to the target, or a smaller --num-speculative-tokens)",
        "speedup": f"specreg promote {ref} --to {env} --allow-slower REASON (an exception recorded in the audit "
                   f"log), or register the recommended k ({register} --num-speculative-tokens K)",
        "approval": f"specreg approve {ref} --user APPROVER --key APPROVER_KEY (a key enrolled to someone other "
                    "than the registrant: specreg keys enrol)",
    }.get(condition)


def refusal_lines(headline: str, reasons: list[tuple[str, str]], label: str, environment: str,
                  golden_set: str) -> list[str]:
    """``headline`` then, per (condition, reason), the reason on one line and its fix below it."""
    lines = [headline]
    for condition, reason in reasons:
        lines.append(f"  - {condition}: {reason}")
        fix = fix_for(condition, label, environment, golden_set, reason)
        if fix:
            lines.append(f"    fix: {fix}")
    return lines


class Refusal(PolicyViolation):
    """A PolicyViolation the CLI prints as several lines (``lines``), the first being the message."""

    def __init__(self, lines: list[str], reasons: list[tuple[str, str]]):
        super().__init__(lines[0], reasons)
        self.lines = lines

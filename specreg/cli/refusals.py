"""A refused promote or gate for people: the root cause first, in one line with the command that
fixes it, then every other unmet condition once, each with its fix. The fixes carry what the
registry knows (the pair's name, its model folders, the k its validation recommends, who may
approve), so they can be run as printed."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from specreg.core.methods import DEFAULT_METHOD
from specreg.errors import PolicyViolation


@dataclass(frozen=True)
class Known:
    """What the registry knows about the refused version, for its fix commands."""

    label: str  # NAME@VERSION
    environment: str
    golden_set: str  # the policy's golden set for the environment
    policy_source: str
    register: list[str]  # the `specreg register` argv that records the same models and config
    k: int  # the version's k
    recommended_k: int | None = None  # what its validation's performance check recommends
    expected_at_recommended: float | None = None  # the speedup that check expects at recommended_k
    approvers: tuple[str, ...] = ()  # people other than the registrant who may approve (policy or keyring)


def known_values(registry, label: str, environment: str, policy) -> Known:
    """Gather ``Known`` for ``label`` refused for ``environment`` under ``policy``."""
    from specreg.core.user_names import same_user

    version = registry.get(label)
    env = policy.environment(environment)
    register = ["specreg", "register", version.name, "--target", version.target.reference]
    if version.draft is not None:
        register += ["--draft", version.draft.reference]
    if version.config.method.value != DEFAULT_METHOD:
        register += ["--method", version.config.method.value]
    recommended = expected = None
    for run in reversed(registry.validation_runs(version.label)):
        performance = (run.summary or {}).get("performance") or {}
        if run.golden_set == env.golden_set and isinstance(performance.get("recommended_k"), int):
            recommended = performance["recommended_k"]
            expected = performance.get("expected_speedup_at_recommended_k")
            break
    people = list(env.approvers)
    if not people:
        try:
            people = [entry.person for entry in registry.keyring(policy)[0]]
        except Exception:  # noqa: BLE001 - a fix hint never hides the refusal it belongs to
            people = []
    approvers = tuple(dict.fromkeys(p for p in people if not same_user(p, version.registered_by)))
    return Known(version.label, environment, env.golden_set, policy.source, register,
                 version.config.num_speculative_tokens, recommended, approvers=approvers,
                 expected_at_recommended=expected if isinstance(expected, (int, float)) else None)


def fix_for(condition: str, known: Known, reason: str = "") -> tuple[str, str] | None:
    """(the command that fixes failed condition ``condition`` (its ``reason``), a note on it), or
    None when no command can."""
    ref, env = shlex.quote(known.label), shlex.quote(known.environment)
    validate = f"specreg validate {ref} --golden {shlex.quote(known.golden_set)}"
    register = shlex.join(known.register + ["--num-speculative-tokens", str(known.k)])
    if condition in ("validation", "golden_set", "validation_age", "baselines") or condition.startswith("check.") \
            or (condition == "speedup" and "measured no speedup" in reason):
        return validate, ""
    if condition == "speedup":
        allow = f"specreg promote {ref} --to {env} --allow-slower REASON"
        if "no k reaches" in reason:  # another k would cost another validation and be refused again
            draft = shlex.join(known.register[:5] + ["--draft", "SMALLER_DRAFT"])
            return (allow, f"an exception recorded in the audit log; or what can reach the floor: a smaller draft "
                           f"(`{draft}`) or a head trained on the target (`--method eagle3 --draft HEAD`)")
        better = known.recommended_k if known.recommended_k not in (None, known.k) else None
        if better is not None:
            expected = (f", expected about {known.expected_at_recommended:.2f}x"
                        if known.expected_at_recommended is not None else "")
            return (shlex.join(known.register + ["--num-speculative-tokens", str(better)]),
                    f"the k its validation recommends{expected}; or promote --allow-slower REASON, an exception "
                    f"recorded in the audit log")
        return allow, "an exception recorded in the audit log"
    if condition == "approval":
        person = known.approvers[0] if known.approvers else None
        if person is None:
            return (f"specreg approve {ref} --user PERSON --key KEY",
                    "by someone other than the registrant, with a key enrolled by `specreg keys enrol`")
        others = f" (or {', '.join(known.approvers[1:])})" if len(known.approvers) > 1 else ""
        return (f"specreg approve {ref} --user {shlex.quote(person)} --key KEY",
                f"run by {person}{others} with their enrolled private key")
    if condition == "min_acceptance":
        smaller = known.recommended_k if known.recommended_k is not None and known.recommended_k < known.k else None
        if smaller is not None:
            return (shlex.join(known.register + ["--num-speculative-tokens", str(smaller)]),
                    "the smaller k its validation recommends, or a draft closer to the target")
        return register, "with a draft closer to the target in --draft"
    if condition == "acceptance":
        return validate, f"to measure again; or register a draft closer to the target: {register}"
    if condition.startswith("engine_baseline."):
        return f"specreg validate {ref} --engine {condition.split('.', 1)[1]}", ""
    return {
        "audit": ("specreg audit verify", "then restore the audit log from a backup"),
        "not_retired": (register, "a retired version stays retired: register it as a new version"),
        "fingerprints": (register, "the models changed since registration: register them as a new version"),
    }.get(condition)


def refusal_lines(headline: str, reasons: list[tuple[str, str]], known: Known) -> list[str]:
    """``headline`` (e.g. "cannot promote chat@1 to production") with the root cause (the first
    of ``reasons``) and its fix on the same line, then each other (condition, reason) once with
    its fix below it."""
    (root, why), others = reasons[0], reasons[1:]
    fix = fix_for(root, known, why)
    first = f"{headline} under {known.policy_source}: {root}: {why}"
    if fix:
        first += f": `{fix[0]}`" + (f" ({fix[1]})" if fix[1] else "")
    lines = [first]
    if others:
        lines.append(f"also unmet ({len(others)}):")
    for condition, reason in others:
        lines.append(f"  - {condition}: {reason}")
        fix = fix_for(condition, known, reason)
        if fix:
            lines.append(f"    fix: {fix[0]}" + (f" ({fix[1]})" if fix[1] else ""))
    return lines


class Refusal(PolicyViolation):
    """A PolicyViolation the CLI prints as several lines (``lines``), the first being the message."""

    def __init__(self, lines: list[str], reasons: list[tuple[str, str]]):
        super().__init__(lines[0], reasons)
        self.lines = lines

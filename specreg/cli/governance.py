"""Governance: approve, reject, promote, rollback, retire, the gate, the audit log, environments, policy."""

from __future__ import annotations

import textwrap

import click

from specreg.cli.root import (PREVIEW_ONLY, cli, db_option, echo_lines, json_option, open_registry,
                                output_width, policy_option, print_json, print_table, printable, say, user_option)
from specreg.core.statuses import GateVerdict
from specreg.errors import SpecregError


@cli.command()
@click.argument("ref", metavar="NAME@VERSION")
@click.option("--note", default=None, help="Why; kept with the approval.")
@click.option("--key", envvar="SPECREG_APPROVAL_KEY", default=None, metavar="FILE",
              help="Your private key (enrolled to you); the approval is your signature.")
@click.option("--env", "environment", default=None, metavar="ENV", help="Approve for this environment only.")
@db_option
@user_option
@json_option
def approve(ref, note, key, environment, db_url, user, as_json):
    """Approve a validated version (four-eyes: never by its registrant)."""
    from specreg.cli.progress import Progress

    with Progress(enabled=not as_json, title=f"approve {ref}"):  # signing and mirroring take seconds
        approval = open_registry(db_url, user).approve(ref, note=note, key=key, environment=environment)
    if as_json:
        print_json(approval.to_dict())
    else:
        say(f"{approval.pair}@{approval.version} approved by {approval.actor}")


@cli.command()
@click.argument("ref", metavar="NAME@VERSION")
@click.option("--note", default=None, help="Why; kept with the rejection.")
@click.option("--key", envvar="SPECREG_APPROVAL_KEY", default=None, metavar="FILE",
              help="Your private key (enrolled to you); the rejection is your signature.")
@click.option("--env", "environment", default=None, metavar="ENV", help="Reject for this environment only.")
@db_option
@user_option
@json_option
def reject(ref, note, key, environment, db_url, user, as_json):
    """Reject a version: a promotion needing approval is refused until someone approves again."""
    approval = open_registry(db_url, user).reject(ref, note=note, key=key, environment=environment)
    if as_json:
        print_json(approval.to_dict())
    else:
        say(f"{approval.pair}@{approval.version} rejected by {approval.actor}")


def parse_expected_holder(value: str | None):
    if value is None:
        return "current"
    if value.lower() == "none":
        return None
    from specreg.usecases.inputs import parse_version

    version = parse_version(value, f"--expect {value[:40]!r}")
    if version is None:
        raise click.BadParameter(f"{value!r}: a version number or 'none'", param_hint="--expect")
    return version


@cli.command()
@click.argument("ref", metavar="NAME@VERSION")
@click.option("--to", "environment", required=True, metavar="ENV", help="Environment to hold (e.g. staging, production).")
@click.option("--reason", default=None, help="Why; kept in the audit log.")
@click.option("--expect", "expected", default=None, metavar="VERSION|none",
              help="Only promote if this version (or none) holds ENV now (default: whatever holds it when the command starts).")
@click.option("--allow-slower", "allow_slower", default=None, metavar="REASON",
              help="Promote although the measured speedup is below the policy's min_speedup: an explicit "
                   "exception, recorded with REASON in the audit log (no other condition is waived).")
@click.option("--policy", "policy_path", default=None, hidden=True)
@db_option
@user_option
@json_option
def promote(ref, environment, reason, expected, allow_slower, policy_path, db_url, user, as_json):
    """Make a version hold ENV if the policy of record allows it (exit 100 with every reason if not)."""
    from specreg.cli.refusals import Refusal, known_values, refusal_lines
    from specreg.errors import PolicyViolation, UsageError

    if policy_path is not None:
        raise UsageError(PREVIEW_ONLY.format(what="a promotion"))
    from specreg.cli.progress import Progress

    registry = open_registry(db_url, user)
    policy = registry.policy()  # one snapshot: what judges the promote also explains a refusal
    try:
        with Progress(enabled=not as_json, title=f"promote {ref} to {environment}"):  # judging and mirroring take seconds
            move = registry.promote(ref, environment, reason=reason, expected_holder=parse_expected_holder(expected),
                                    allow_slower=allow_slower, policy=policy)
    except PolicyViolation as exc:
        if not exc.reasons:
            raise
        known = known_values(registry, ref, environment, policy)
        if as_json:
            print_json({"pair": known.label.split("@")[0], "version": int(known.label.split("@")[1]),
                        "environment": environment, "promoted": False, "policy": policy.source,
                        "reasons": [f"{name}: {why}" for name, why in exc.reasons]})
        raise Refusal(refusal_lines(f"cannot promote {known.label} to {environment}", exc.reasons, known),
                      exc.reasons) from None
    if as_json:
        print_json(move.to_dict())
        return
    if move.action == "unchanged":  # a pipeline's re-run: succeeds, and says that nothing changed
        say(f"{move.pair}@{move.version} already holds {move.environment}: nothing to do (nothing changed, "
            "nothing recorded)")
        return
    before = f" (previous holder {move.pair}@{move.previous_version})" if move.previous_version else ""
    say(f"promoted {move.pair}@{move.version} to {move.environment}{before}")
    if move.exception:
        say(f"specreg: EXCEPTION recorded in the audit log: {move.pair}@{move.version} holds "
                   f"{move.environment} with a measured speedup of {move.exception['speedup']:.2f}x, below the "
                   f"policy's {move.exception['floor']:g}x; reason: {printable(allow_slower)}", err=True)
    elif allow_slower:
        say("specreg: note: --allow-slower was not needed (the speedup meets the policy); no exception "
                   "recorded", err=True)


@cli.command()
@click.argument("name")
@click.option("--env", "environment", required=True, metavar="ENV", help="Environment to roll back.")
@click.option("--reason", default=None, help="Why; kept in the audit log.")
@db_option
@user_option
@json_option
def rollback(name, environment, reason, db_url, user, as_json):
    """Point ENV of pair NAME back at the version that held it before, in one step."""
    move = open_registry(db_url, user).rollback(name, environment, reason=reason)
    if as_json:
        print_json(move.to_dict())
    else:
        say(f"{move.pair}@{move.environment} rolled back to version {move.version}"
                   + (f" (from version {move.previous_version})" if move.previous_version else ""))


@cli.command()
@click.argument("ref", metavar="NAME@VERSION")
@click.option("--reason", default=None, help="Why; kept in the audit log.")
@click.option("--force", is_flag=True, help="Retire even while it holds an environment (that environment is left empty).")
@db_option
@user_option
@json_option
def retire(ref, reason, force, db_url, user, as_json):
    """Retire a version (refused while it holds an environment, unless --force)."""
    version = open_registry(db_url, user).retire(ref, reason=reason, force=force)
    if as_json:
        print_json(version.to_dict(with_events=False))
    else:
        say(f"retired {version.label}")


@cli.command()
@click.argument("ref", metavar="NAME@VERSION|NAME@ENV")
@click.option("--env", "environment", required=True, metavar="ENV", help="Environment the version should hold.")
@click.option("--rerun", is_flag=True, help="Validate again (on the policy's golden set) before judging.")
@click.option("--junit", "junit_path", default=None, metavar="FILE", help="Write JUnit XML: one testcase per condition.")
@click.option("--markdown", "markdown_path", default=None, metavar="FILE", help="Write a Markdown summary (e.g. $GITHUB_STEP_SUMMARY).")
@policy_option
@db_option
@user_option
@json_option
def gate(ref, environment, rerun, junit_path, markdown_path, policy_path, db_url, user, as_json):
    """CI/CD gate: exit 0 if REF may hold ENV now, 100 if refused, 1 on any error (fail closed)."""
    from specreg.cli.progress import Progress
    from specreg.errors import PolicyViolation

    result, error, code, registry, policy = None, None, 0, None, None
    progress = Progress(enabled=not as_json)
    try:
        registry = open_registry(db_url, user)
        policy = registry.policy()  # one snapshot: what judges the gate also explains a refusal
        result = registry.gate(ref, environment, policy_path=policy_path, rerun=rerun, progress=progress,
                               policy=policy)
        code = 0 if result.passed else PolicyViolation.exit_code
    except SpecregError as exc:
        error, code = str(exc), exc.exit_code
    except Exception as exc:  # noqa: BLE001 - fail closed: a crash must never pass the gate
        error, code = f"gate failed closed: {type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}", 1
    progress.close()
    write_gate_outputs(result, error, ref, junit_path, markdown_path)
    if as_json:
        print_json(result.to_dict() if result is not None else
                   {"ref": ref, "environment": environment, "passed": False, "verdict": GateVerdict.ERROR.value, "error": error})
    elif result is not None:
        if result.passed:
            say(f"gate {result.pair}@{result.version} -> {environment}: PASS  (policy {result.policy_source})")
            print_table(["", "CONDITION", "REASON"], [["ok", c.name, c.reason] for c in result.conditions])
        if result.preview is not None:
            say(f"preview under {result.preview['policy']}: it would "
                f"{'PASS' if result.preview['passed'] else 'be REFUSED'} (decides nothing: "
                f"{result.policy_source} decides)")
    if error is not None:
        raise GateError(error, code)
    if code:
        # each reason once, on stderr, root cause first (`--json` or --junit for every condition)
        from specreg.cli.refusals import Refusal, known_values, refusal_lines
        from specreg.registry.governance.decisions import unmet

        failed = [(c.name, c.reason) for c in unmet(result.conditions)]
        label = f"{result.pair}@{result.version}"
        known = known_values(registry, label, environment, policy)
        raise Refusal(refusal_lines(f"gate refused {label} for {environment}", failed, known), failed)


class GateError(SpecregError):
    """An error inside the gate, carrying the exit code of the error it wraps."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


def write_gate_outputs(result, error, ref, junit_path, markdown_path) -> None:
    from specreg.core.files import write_fresh
    from specreg.registry.governance.gate_report import junit_xml, markdown_summary

    for option, path, text in (("--junit", junit_path, lambda: junit_xml(result, error, subject=ref)),
                               ("--markdown", markdown_path, lambda: markdown_summary(result, error, subject=ref))):
        if path:
            write_fresh(path, text(), option)


@cli.group()
def audit() -> None:
    """The tamper-evident audit log."""


@audit.command(name="verify")
@click.option("--expect-head", "expected_head", default=None, metavar="HASH",
              help="An audit head recorded earlier (gate output, export header, MLflow tag specreg.audit_head): "
                   "exit 100 unless the chain still contains it.")
@db_option
@json_option
def audit_verify(expected_head, db_url, as_json):
    """Check the whole hash chain; exit 1 naming the first broken event, 100 when an anchored
    head (--expect-head) is no longer in the chain (events deleted from the end, or re-hashed)."""
    from specreg.errors import PolicyViolation

    registry = open_registry(db_url)
    position, checked, problem, head = registry.audit_anchor(expected_head)
    anchored = None if expected_head is None else position is not None
    not_counted = registry.not_counted()
    if as_json:
        print_json({"intact": problem is None, "checked": checked, "problem": problem, "head": head,
                    "not_counted": not_counted,
                    **({"expected_head": expected_head, "expected_head_found": anchored,
                        "events_since_expected_head": checked - position if position is not None else None}
                       if expected_head is not None else {})})
    if problem is not None:
        raise SpecregError(f"audit log broken after {checked} good event(s): {problem}")
    if expected_head is not None and position is None:
        raise PolicyViolation(f"audit head {expected_head} is not in the chain of {checked} event(s) (head now "
                              f"{head}): events were deleted from its end or the chain was re-hashed")
    if not as_json:
        say(f"audit log intact: {checked} event(s), every hash links; head {head}")
        for line in not_counted:
            say(f"NOT COUNTED  {line}")
        if expected_head is not None:
            say(f"expected head found at event {position} of {checked} ({checked - position} event(s) since)")


@cli.group(name="env")
def env_group() -> None:
    """Environments and which version holds each."""


@env_group.command(name="list")
@click.argument("name", required=False)
@db_option
@json_option
def env_list(name, db_url, as_json):
    """Every environment pointer (of pair NAME or of all pairs)."""
    rows = open_registry(db_url).environments(name)
    if as_json:
        print_json(rows)
        return
    if not rows:
        say("no environment holds a version yet")
        return
    print_table(["PAIR", "ENV", "VERSION", "PREVIOUS", "BY", "AT (UTC)"],
                [[r["pair"], r["environment"], r["version"] or "(none)", r["previous_version"], r["updated_by"],
                  r["updated_at"]] for r in rows])


@env_group.command(name="history")
@click.argument("name")
@click.option("--env", "environment", required=True, metavar="ENV", help="The environment.")
@click.option("--at", "at", default=None, metavar="TIME",
              help="Only the version that held ENV at TIME (ISO 8601; UTC when no offset is given).")
@db_option
@json_option
def env_history(name, environment, at, db_url, as_json):
    """Which version of pair NAME held ENV when (from the audit log of promote, rollback, retire)."""
    tenures = open_registry(db_url).environment_history(name, environment, at=at)
    if as_json:
        print_json([t.to_dict() for t in tenures])
        return
    if at is not None:
        if not tenures:
            say(f"no version of {name} held {environment} at {at}")
        else:
            t = tenures[0]
            say(f"{name}@{t.version} held {environment} at {at} (since {t.to_dict()['since']}, "
                       f"{t.action} by {t.actor})")
        return
    if not tenures:
        say(f"no version of {name} has held {environment}")
        return
    print_table(["VERSION", "SINCE (UTC)", "UNTIL (UTC)", "BY", "ACTION", "REASON"],
                [[t.version if t.version is not None else "(none)", t.to_dict()["since"], t.to_dict()["until"] or "now",
                  t.actor, t.action, t.reason] for t in tenures])


@cli.group(name="policy")
def policy_group() -> None:
    """The promotion policy."""


@policy_group.command(name="show")
@policy_option
@db_option
@json_option
def policy_show(policy_path, db_url, as_json):
    """Print the policy of record (or, with --policy FILE, preview that file)."""
    from specreg.registry.governance.policy import DEFAULT_POLICY_TOML, load_policy

    record = None
    if policy_path is not None:
        policy = load_policy(policy_path)
    else:
        record = open_registry(db_url).policy_record()
        policy = record.policy
    if as_json:
        print_json({**policy.to_dict(), "sha256": policy.sha256,
                    **({"record": record.to_dict()} if record is not None else {"preview": True})})
        return
    if record is not None:
        approved = f", approved by {', '.join(record.approved_by)}" if record.approved_by else ""
        say(f"# {policy.source} (sha256 {policy.sha256[:12]}"
                   + (f", proposed by {record.proposed_by}{approved}" if record.proposed_by else "") + ")")
        for problem in record.problems:
            say(f"# NOT COUNTED: {printable(problem)}")
    else:
        say(f"# preview of {policy.source}: decides nothing until proposed and approved "
                   f"(`specreg policy propose {policy.source}`)")
    notes = [policy.identity_text()] + [line for env in policy.environments.values() for line in env.floors_text()]
    width = output_width()  # a terminal: wrapped to it; a pipe: one line a note
    comments = [f"# {part}" for note in notes for part in (textwrap.wrap(note, width - 2) if width else [note])]
    if policy.version == 0:
        echo_lines(DEFAULT_POLICY_TOML.rstrip().splitlines() + comments)
        return
    echo_lines([f"# {policy.source}"] + comments)
    for env in policy.environments.values():
        if env.required_engine_baselines:
            engines = ", ".join(env.required_engine_baselines)
            say(f"# {env.name}: a version needs a passed engine baseline from {engines} (`specreg validate "
                       f"NAME@V --engine ENGINE` on golden set {env.golden_set}) before it is promoted; exports "
                       f"and alert rules for that engine use its baseline")
    print_table(["ENV", "GOLDEN SET", "APPROVAL", "APPROVERS", "TOLERANCE", "MAX AGE (DAYS)", "MIN ACCEPTANCE",
                 "MIN SPEEDUP", "ENGINE BASELINES", "REQUIRED CHECKS"],
                [[e.name, e.golden_set, "required" if e.approval_required else "-", ", ".join(e.approvers) or "anyone but registrant",
                  f"{e.acceptance_tolerance:.0%}", e.max_validation_age_days or "-",
                  "-" if e.min_acceptance_rate is None else f"{e.min_acceptance_rate:g}",
                  "-" if e.min_speedup is None else f"{e.min_speedup:g}x", ", ".join(e.required_engine_baselines) or "-",
                  "; ".join([", ".join(e.required_checks)] + [f"{method}: {', '.join(checks)}" for method, checks
                                                               in e.required_checks_by_method.items()])]
                 for e in policy.environments.values()])


@policy_group.command(name="propose")
@click.argument("policy_file", metavar="FILE")
@click.option("--note", default=None, help="Why; kept in the audit log.")
@db_option
@user_option
@json_option
def policy_propose(policy_file, note, db_url, user, as_json):
    """Propose FILE as the next policy of record (it governs once approved by the four-eyes rule
    of the policy in effect: `specreg policy approve VERSION --key FILE`)."""
    proposed = open_registry(db_url, user).propose_policy(policy_file, note)
    if as_json:
        print_json(proposed)
        return
    say(f"proposed policy v{proposed['version']} (sha256 {proposed['sha256'][:12]}); it governs once it has "
        f"{proposed['needs']}: `specreg policy approve {proposed['version']} --key FILE`")


@policy_group.command(name="approve")
@click.argument("version", type=int)
@click.option("--key", default=None, metavar="FILE",
              help="Your private approval key (default: $SPECREG_APPROVAL_KEY), enrolled to you.")
@click.option("--note", default=None, help="Why; kept in the audit log.")
@db_option
@user_option
@json_option
def policy_approve(version, key, note, db_url, user, as_json):
    """Sign your approval of proposed policy VERSION (never the proposer's own)."""
    approved = open_registry(db_url, user).approve_policy(version, key=key, note=note)
    if as_json:
        print_json(approved)
        return
    if approved["active"]:
        say(f"approved policy v{version}: it is now the policy of record")
    else:
        say(f"approved policy v{version}; not yet in effect: {printable(approved['standing'])}")


@policy_group.command(name="history")
@db_option
@json_option
def policy_history(db_url, as_json):
    """Every proposed policy version: who proposed and approved it, and which one governs."""
    listed = open_registry(db_url).policy_history()
    if as_json:
        print_json(listed)
        return
    if not listed:
        say("no policy proposed yet: the built-in default governs (`specreg policy show`)")
        return
    print_table(["VERSION", "STATE", "SHA256", "PROPOSED BY", "AT (UTC)", "APPROVED BY", "NOTE"],
                [[p["version"], p["state"], p["sha256"][:12], p["proposed_by"], p["proposed_at"],
                  ", ".join(p["approved_by"]) or "-", p["note"] or ""] for p in listed])

"""The `specreg` command line: each command parses, calls the Python API and prints.

Heavy libraries (torch, transformers, mlflow) are imported inside the commands that need
them, never at module level: `specreg --help`, `list` and `show` stay fast.
"""

from __future__ import annotations

import json
import sys

import click

from specreg.errors import SpecregError

db_option = click.option(
    "--db", "db_url", envvar="SPECREG_DB", default=None, metavar="URL",
    help="SQLAlchemy URL of the registry database (default: $SPECREG_HOME/registry.db).",
)
user_option = click.option(
    "--user", "user", envvar="SPECREG_USER", default=None,
    help="Who acts (default: $SPECREG_USER or the OS user).",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for machines.")


OPENED_REGISTRIES: list = []  # their warnings (e.g. "MLflow is behind") are printed at exit


def open_registry(db_url: str | None, user: str | None = None):
    from specreg.api import Registry

    context = click.get_current_context(silent=True)
    mlflow_uri = context.find_root().params.get("mlflow_uri") if context else None
    registry = Registry(db_url, user=user, mlflow_uri=mlflow_uri)
    OPENED_REGISTRIES.append(registry)
    return registry


def print_warnings() -> None:
    for registry in OPENED_REGISTRIES:
        for warning in registry.warnings:
            click.echo(f"specreg: warning: {warning}", err=True)
        registry.warnings.clear()


def print_json(data) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False, default=str))


def print_table(headers: list[str], rows: list[list]) -> None:
    """A plain aligned table for people."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    click.echo("\n".join(lines))  # one write: 10,000 separate echoes cost a third of `list`


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="specreg")
@click.option("--mlflow-uri", envvar="MLFLOW_TRACKING_URI", default=None, metavar="URI",
              help="MLflow tracking URI for review (default: the local store in $SPECREG_HOME/mlflow).")
def cli(mlflow_uri) -> None:
    """specreg: register, validate, approve, promote and export speculative-decoding pairs."""


# --- registration and inspection -------------------------------------------------------

@cli.command()
@click.argument("name")
@click.option("--target", required=True, metavar="REF", help="Target model: local HF directory or ORG/NAME@REVISION in the local cache.")
@click.option("--draft", default=None, metavar="REF", help="Draft model (method draft_model).")
@click.option("--num-speculative-tokens", "-k", "num_speculative_tokens", type=int, required=True, help="Draft tokens per step (k).")
@click.option("--method", type=click.Choice(["draft_model", "ngram"]), default="draft_model", show_default=True)
@click.option("--prompt-lookup-min", type=int, default=None, help="ngram: shortest n-gram to match.")
@click.option("--prompt-lookup-max", type=int, default=None, help="ngram: longest n-gram to match.")
@click.option("--max-batch-size-for-speculation", type=int, default=None, help="Speculation off above this batch size.")
@click.option("--notes", default=None, help="Free text kept with the version.")
@click.option("--allow-pickle", is_flag=True, help="Accept pickle-only weights (.bin/.pt); recorded on the version.")
@db_option
@user_option
@json_option
def register(name, target, draft, num_speculative_tokens, method, prompt_lookup_min, prompt_lookup_max,
             max_batch_size_for_speculation, notes, allow_pickle, db_url, user, as_json):
    """Register draft + target + speculative config as version N+1 of pair NAME."""
    registry = open_registry(db_url, user)
    result = registry.register(
        name, target=target, draft=draft, num_speculative_tokens=num_speculative_tokens, method=method,
        prompt_lookup_min=prompt_lookup_min, prompt_lookup_max=prompt_lookup_max,
        max_batch_size_for_speculation=max_batch_size_for_speculation, notes=notes, allow_pickle=allow_pickle,
    )
    version = result.version
    if as_json:
        print_json({"created": result.created, **version.to_dict(with_events=False)})
    elif result.created:
        click.echo(f"registered {version.label} (binding {version.binding_sha256[:12]})")
    else:
        click.echo(f"already registered as {version.label}: same fingerprints and config, nothing new recorded")


@cli.command(name="list")
@db_option
@json_option
def list_command(db_url, as_json):
    """List every pair version."""
    rows = open_registry(db_url).list_summaries()
    if as_json:
        print_json(rows)
        return
    if not rows:
        click.echo("no pairs registered")
        return
    print_table(["PAIR", "VERSION", "STATE", "METHOD", "K", "BY", "REGISTERED (UTC)"],
                [[r["name"], r["version"], r["state"], r["method"], r["num_speculative_tokens"],
                  r["registered_by"], r["registered_at"]] for r in rows])


def describe_model(role: str, model) -> list[str]:
    fp = model.fingerprint
    params = f"{fp.parameter_count:,}" if fp.parameter_count is not None else "?"
    return [
        f"{role}: {model.reference}" + (f" (revision {model.revision})" if model.revision else ""),
        f"  path            {model.path}",
        f"  architecture    {fp.architecture}  vocab {fp.vocab_size} (tokenizer {fp.tokenizer_length})  "
        f"params {params}  dtype {fp.dtype}  max positions {fp.max_position_embeddings}",
        f"  weights         {fp.weights_sha256}  ({fp.weight_format}, {len(fp.weight_files)} file(s))",
        f"  config          {fp.config_sha256}",
        f"  tokenizer       {fp.tokenizer_sha256}",
        f"  chat template   {fp.chat_template_sha256 or '(none)'}",
    ]


@cli.command()
@click.argument("ref", metavar="NAME[@VERSION]")
@db_option
@json_option
def show(ref, db_url, as_json):
    """Show one pair version: models, fingerprints, config, state and events."""
    registry = open_registry(db_url)
    version = registry.get(ref, with_events=True)
    observations = registry.observations(version.label)
    validations = registry.validation_runs(version.label)  # also marks runs of dead processes aborted
    if as_json:
        print_json({**version.to_dict(), "observations": observations,
                    "validations": [{key: value for key, value in run.to_dict().items() if key != "checks"}
                                    | {"checks": {c.name: c.status for c in run.checks}} for run in validations]})
        return
    config = version.config
    lines = [f"{version.label}  state {version.state.value}  binding {version.binding_sha256}",
             f"registered by {version.registered_by} at {version.registered_at.isoformat(timespec='seconds')} UTC"]
    if version.notes:
        lines.append(f"notes: {version.notes}")
    lines.append(f"config: method {config.method.value}, k {config.num_speculative_tokens}"
                 + (f", prompt lookup {config.prompt_lookup_min}..{config.prompt_lookup_max}" if config.prompt_lookup_max else "")
                 + (f", speculation off above batch {config.max_batch_size_for_speculation}" if config.max_batch_size_for_speculation else "")
                 + (", pickle weights allowed" if version.allow_pickle else ""))
    lines += describe_model("target", version.target)
    if version.draft:
        lines += describe_model("draft", version.draft)
    if validations:
        lines.append("validations:")
        for run in validations:
            failed = f"  failed: {', '.join(run.failed_checks)}" if run.failed_checks else ""
            lines.append(f"  run {run.id}  {run.started_at.isoformat(timespec='seconds')}  {run.status:<8} golden "
                         f"{run.golden_set}  {run.environment.get('device')}/{run.environment.get('dtype')}{failed}"
                         + (f"  ({run.error})" if run.error else ""))
    if observations:
        lines.append("observations (newest first):")
        for o in observations:
            figures = o["figures"]
            lines.append(f"  {o['observed_at']}  {o['engine']:<7} {o['verdict']:<8} acceptance rate "
                         f"{fmt_number(figures.get('acceptance_rate'))}  mean acceptance length "
                         f"{fmt_number(figures.get('mean_acceptance_length'))}  {o['url']}")
    lines.append("events:")
    for event in version.events:
        move = f"{event.from_state or '-'} -> {event.to_state or '-'}"
        lines.append(f"  {event.created_at.isoformat(timespec='seconds')}  {event.action:<10} {move:<26} {event.actor}"
                     + (f"  {event.reason}" if event.reason else ""))
    click.echo("\n".join(lines))


@cli.command()
@click.argument("name")
@db_option
@json_option
def history(name, db_url, as_json):
    """Every audit event of pair NAME, oldest first."""
    events = open_registry(db_url).history(name)
    if as_json:
        print_json([event.to_dict() for event in events])
        return
    print_table(["AT (UTC)", "VERSION", "ACTION", "FROM", "TO", "BY", "REASON"],
                [[e.created_at.isoformat(timespec="seconds"), e.version, e.action, e.from_state, e.to_state,
                  e.actor, e.reason] for e in events])


# --- validation ---------------------------------------------------------------------------

@cli.command()
@click.argument("ref", metavar="NAME@VERSION")
@click.option("--golden", default="default", show_default=True, metavar="SET|PATH", help="Shipped golden set name or a .yaml/.jsonl file.")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda", "mps"]), default="auto", show_default=True)
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default="float32", show_default=True)
@click.option("--checks", default=None, metavar="LIST", help="Comma-separated subset: integrity,tokenizer,chat_template,memory,equivalence,distribution,acceptance,performance.")
@click.option("--gpu-memory", default=None, metavar="SIZE", help="Device memory budget, e.g. 80GiB (default: the CUDA device's).")
@click.option("--acceptance-tolerance", type=float, default=0.10, show_default=True, help="Relative acceptance drop vs the previous validated version that fails.")
@click.option("--near-tie-tolerance", type=float, default=None, help="Logit margin below which a greedy divergence is a near-tie (default by dtype).")
@click.option("--distribution-samples", type=int, default=4000, show_default=True, help="Draws per prefix for the distribution check.")
@click.option("--report", "report_path", default=None, metavar="FILE", help="Write the HTML report.")
@click.option("--markdown", "markdown_path", default=None, metavar="FILE", help="Write a Markdown summary (e.g. $GITHUB_STEP_SUMMARY).")
@click.option("--junit", "junit_path", default=None, metavar="FILE", help="Write JUnit XML: one testcase per check.")
@db_option
@user_option
@json_option
def validate(ref, golden, device, dtype, checks, gpu_memory, acceptance_tolerance, near_tie_tolerance,
             distribution_samples, report_path, markdown_path, junit_path, db_url, user, as_json):
    """Validate a pair version on golden prompts; exit 0 pass, 100 a check failed, 1 error."""
    from specreg.errors import PolicyViolation
    from specreg.registry import reports
    from specreg.registry.validations import ValidationInterrupted

    registry = open_registry(db_url, user)
    stderr = sys.stderr
    bar = None

    def progress(done, total, record_id):
        nonlocal bar
        if not stderr.isatty():
            return
        if bar is None:
            bar = click.progressbar(length=total, label="decoding golden prompts", file=stderr, show_pos=True)
            bar.__enter__()
        bar.update(1)

    try:
        outcome = registry.validate(ref, golden=golden, device=device, dtype=dtype, checks=checks,
                                    gpu_memory=gpu_memory, acceptance_tolerance=acceptance_tolerance,
                                    near_tie_tolerance=near_tie_tolerance,
                                    distribution_samples=distribution_samples, progress=progress)
    except ValidationInterrupted as exc:
        click.echo(f"specreg: validation aborted by {exc.signal_name}; the pair's state is unchanged", err=True)
        sys.exit(128 + exc.signal_number)
    finally:
        if bar is not None:
            bar.__exit__(None, None, None)
            bar = None
    run, version = outcome.run, outcome.version
    for path, render in ((report_path, lambda: reports.render_html(run, version)),
                         (markdown_path, lambda: reports.render_markdown(run, version)),
                         (junit_path, lambda: reports.render_junit(run))):
        if path:
            reports.write_text(path, render())
    if as_json:
        print_json({**run.to_dict(), "state": version.state.value})
    else:
        print_table(["CHECK", "STATUS", "SUMMARY"], [[c.name, c.status, c.summary] for c in run.checks])
        click.echo(f"{run.label}: validation run {run.id} {run.status}; state {version.state.value}")
    if not outcome.passed:
        raise PolicyViolation(f"{run.label} failed validation run {run.id}: {', '.join(run.failed_checks)} failed")


# --- governance: approve, promote, rollback, retire, gate, diff, audit --------------------

policy_option = click.option(
    "--policy", "policy_path", envvar="SPECREG_POLICY", default=None, metavar="FILE",
    help="Policy file, TOML or YAML (default: $SPECREG_POLICY or the built-in policy; see `specreg policy show`).",
)


@cli.command()
@click.argument("ref", metavar="NAME@VERSION")
@click.option("--note", default=None, help="Why; kept with the approval.")
@db_option
@user_option
@json_option
def approve(ref, note, db_url, user, as_json):
    """Approve a validated version (four-eyes: never by its registrant)."""
    approval = open_registry(db_url, user).approve(ref, note=note)
    if as_json:
        print_json(approval.to_dict())
    else:
        click.echo(f"{approval.pair}@{approval.version} approved by {approval.actor}")


@cli.command()
@click.argument("ref", metavar="NAME@VERSION")
@click.option("--note", default=None, help="Why; kept with the rejection.")
@db_option
@user_option
@json_option
def reject(ref, note, db_url, user, as_json):
    """Reject a version: a promotion needing approval is refused until someone approves again."""
    approval = open_registry(db_url, user).reject(ref, note=note)
    if as_json:
        print_json(approval.to_dict())
    else:
        click.echo(f"{approval.pair}@{approval.version} rejected by {approval.actor}")


def parse_expected_holder(value: str | None):
    if value is None:
        return "current"
    if value.lower() == "none":
        return None
    digits = value[1:] if value[:1] == "v" else value
    if not digits.isdigit():
        raise click.BadParameter(f"{value!r}: a version number or 'none'", param_hint="--expect")
    return int(digits)


@cli.command()
@click.argument("ref", metavar="NAME@VERSION")
@click.option("--to", "environment", required=True, metavar="ENV", help="Environment to hold (e.g. staging, production).")
@click.option("--reason", default=None, help="Why; kept in the audit log.")
@click.option("--expect", "expected", default=None, metavar="VERSION|none",
              help="Only promote if this version (or none) holds ENV now (default: whatever holds it when the command starts).")
@policy_option
@db_option
@user_option
@json_option
def promote(ref, environment, reason, expected, policy_path, db_url, user, as_json):
    """Make a version hold ENV if the policy allows it (exit 100 with every reason if not)."""
    move = open_registry(db_url, user).promote(ref, environment, reason=reason, policy_path=policy_path,
                                               expected_holder=parse_expected_holder(expected))
    if as_json:
        print_json(move.to_dict())
    else:
        before = f" (previous holder {move.pair}@{move.previous_version})" if move.previous_version else ""
        click.echo(f"promoted {move.pair}@{move.version} to {move.environment}{before}")


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
        click.echo(f"{move.pair}@{move.environment} rolled back to version {move.version}"
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
        click.echo(f"retired {version.label}")


@cli.command()
@click.argument("ref_a", metavar="NAME@A")
@click.argument("ref_b", metavar="NAME@B")
@click.option("--all", "show_all", is_flag=True, help="Show equal rows too.")
@db_option
@json_option
def diff(ref_a, ref_b, show_all, db_url, as_json):
    """Models, fingerprints, config and validation figures of two versions side by side."""
    registry = open_registry(db_url)
    rows = registry.diff(ref_a, ref_b)
    if as_json:
        print_json({"a": ref_a, "b": ref_b, "rows": rows})
        return
    shown = [r for r in rows if show_all or not r["same"]]
    if not shown:
        click.echo(f"{ref_a} and {ref_b} do not differ")
        return
    print_table(["", "SECTION", "FIELD", ref_a.upper(), ref_b.upper()],
                [["=" if r["same"] else "≠", r["section"], r["field"], short_value(r["a"]), short_value(r["b"])]
                 for r in shown])


def short_value(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4f}"
    if isinstance(value, (list, dict)):
        return json.dumps(value, default=str)
    text = str(value)
    return text[:16] if len(text) == 64 and all(c in "0123456789abcdef" for c in text) else text


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
    from specreg.errors import PolicyViolation

    result, error, code = None, None, 0
    try:
        result = open_registry(db_url, user).gate(ref, environment, policy_path=policy_path, rerun=rerun)
        code = 0 if result.passed else PolicyViolation.exit_code
    except SpecregError as exc:
        error, code = str(exc), exc.exit_code
    except Exception as exc:  # noqa: BLE001 - fail closed: a crash must never pass the gate
        error, code = f"gate failed closed: {type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}", 1
    write_gate_outputs(result, error, ref, junit_path, markdown_path)
    if as_json:
        print_json(result.to_dict() if result is not None else
                   {"ref": ref, "environment": environment, "passed": False, "verdict": "error", "error": error})
    elif result is not None:
        click.echo(f"gate {result.pair}@{result.version} -> {environment}: {'PASS' if result.passed else 'REFUSED'}"
                   f"  (policy {result.policy_source})")
        print_table(["", "CONDITION", "REASON"],
                    [["ok" if c.passed else "NO", c.name, c.reason] for c in result.conditions])
    if error is not None:
        raise GateError(error, code)
    if code:
        raise PolicyViolation(f"gate refused {result.pair}@{result.version} for {environment}: "
                              + "; ".join(result.reasons))


class GateError(SpecregError):
    """An error inside the gate, carrying the exit code of the error it wraps."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


def write_gate_outputs(result, error, ref, junit_path, markdown_path) -> None:
    from specreg.registry.gate_report import junit_xml, markdown_summary

    for path, text in ((junit_path, lambda: junit_xml(result, error, subject=ref)),
                       (markdown_path, lambda: markdown_summary(result, error, subject=ref))):
        if path:
            try:
                with open(path, "w", encoding="utf-8") as handle:
                    handle.write(text())
            except OSError as exc:
                raise SpecregError(f"cannot write {path}: {exc.strerror or exc}") from None


@cli.group()
def audit() -> None:
    """The tamper-evident audit log."""


@audit.command(name="verify")
@db_option
@json_option
def audit_verify(db_url, as_json):
    """Check the whole hash chain; exit 1 naming the first broken event."""
    checked, problem = open_registry(db_url).verify_audit()
    if as_json:
        print_json({"intact": problem is None, "checked": checked, "problem": problem})
    if problem is not None:
        raise SpecregError(f"audit log broken after {checked} good event(s): {problem}")
    if not as_json:
        click.echo(f"audit log intact: {checked} event(s), every hash links")


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
        click.echo("no environment holds a version yet")
        return
    print_table(["PAIR", "ENV", "VERSION", "PREVIOUS", "BY", "AT (UTC)"],
                [[r["pair"], r["environment"], r["version"] or "(none)", r["previous_version"], r["updated_by"],
                  r["updated_at"]] for r in rows])


@cli.group(name="policy")
def policy_group() -> None:
    """The promotion policy."""


@policy_group.command(name="show")
@policy_option
@json_option
def policy_show(policy_path, as_json):
    """Print the effective policy (file or built-in default)."""
    from specreg.registry.policy import DEFAULT_POLICY_TOML, load_policy

    policy = load_policy(policy_path)
    if as_json:
        print_json(policy.to_dict())
        return
    if policy.source == "built-in default":
        click.echo(DEFAULT_POLICY_TOML.rstrip())
        return
    click.echo(f"# {policy.source}")
    print_table(["ENV", "GOLDEN SET", "APPROVAL", "APPROVERS", "TOLERANCE", "MAX AGE (DAYS)", "REQUIRED CHECKS"],
                [[e.name, e.golden_set, "required" if e.approval_required else "-", ", ".join(e.approvers) or "anyone but registrant",
                  f"{e.acceptance_tolerance:.0%}", e.max_validation_age_days or "-", ", ".join(e.required_checks)]
                 for e in policy.environments.values()])


# --- deployment ---------------------------------------------------------------------------

@cli.command()
@click.argument("ref", metavar="NAME@VERSION|NAME@ENV")
@click.option("--format", "fmt", required=True,
              type=click.Choice(["vllm", "sglang", "trtllm", "tgi", "k8s-vllm", "prometheus-rules"]))
@click.option("-o", "--output", "out_dir", default=None, metavar="DIR", help="Write the files here (default: print them).")
@click.option("--template", default=None, metavar="PATH", help="Render this Jinja2 template (sandboxed) instead.")
@click.option("--option", "option_pairs", multiple=True, metavar="KEY=VALUE",
              help="Override an export option (port, tensor_parallel_size, tolerance, for, image, ...).")
@click.option("--force", is_flag=True, help="Export a version that is not validated and approved (marked UNAPPROVED); overwrite files.")
@db_option
@json_option
def export(ref, fmt, out_dir, template, option_pairs, force, db_url, as_json):
    """Write deployment configs for a serving engine, with the pair's identity and baselines."""
    from specreg.errors import UsageError

    options = {}
    for pair in option_pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"invalid --option {pair!r}: use KEY=VALUE")
        options[key] = yaml_scalar(value)
    files = open_registry(db_url).export(ref, fmt, out_dir=out_dir, force=force, overwrite=force,
                                         template=template, options=options or None)
    if as_json:
        print_json([{"file": name, "text": text} for name, text in files])
    elif out_dir:
        for name, _ in files:
            click.echo(f"wrote {out_dir.rstrip('/')}/{name}")
    else:
        for name, text in files:
            click.echo(f"# --- {name}\n{text}", nl=not text.endswith("\n"))


def yaml_scalar(value: str):
    """--option values: numbers and booleans as such, everything else a string."""
    import yaml

    parsed = yaml.safe_load(value) if value else value
    return parsed if isinstance(parsed, (int, float, bool)) else value


@cli.command()
@click.argument("ref", metavar="NAME@ENV|NAME@VERSION")
@click.option("--metrics-url", required=True, metavar="URL", help="The engine's Prometheus endpoint, e.g. http://host:8000/metrics.")
@click.option("--engine", type=click.Choice(["vllm", "sglang", "trtllm"]), default="vllm", show_default=True)
@click.option("--interval", type=float, default=30.0, show_default=True, help="Seconds between the two scrapes.")
@click.option("--model-name", default=None, help="Only series with this model_name label.")
@click.option("--tolerance", type=float, default=None, help="Relative drop that counts as drift (default: the policy's).")
@click.option("--policy", "policy_path", envvar="SPECREG_POLICY", default=None, metavar="FILE")
@db_option
@json_option
def observe(ref, metrics_url, engine, interval, model_name, tolerance, policy_path, db_url, as_json):
    """Live acceptance from the engine's metrics against the recorded baseline (exit 0 ok, 100 drift, 1 error)."""
    result = open_registry(db_url).observe(ref, metrics_url, engine=engine, interval=interval,
                                           model_name=model_name, tolerance=tolerance, policy_path=policy_path)
    if as_json:
        print_json(result)
    else:
        click.echo(f"{result['pair']} via {engine} at {metrics_url}: {result['verdict']}")
        print_table(["METRIC", "LIVE", "BASELINE", "FLOOR", "OK"],
                    [[c["metric"], fmt_number(c["live"]), fmt_number(c["baseline"]), fmt_number(c["floor"]),
                      {True: "yes", False: "NO", None: "-"}[c["ok"]]] for c in result["checks"]])
        for reason in result["reasons"]:
            click.echo(f"- {reason}")
    sys.exit(result["exit_code"])


def fmt_number(value) -> str:
    return "-" if value is None else f"{value:.4f}"


# --- MLflow review ------------------------------------------------------------------------

@cli.command()
@click.argument("name", required=False)
@db_option
@user_option
@json_option
def sync(name, db_url, user, as_json):
    """Bring MLflow up to date with the registry and read approvals set in the MLflow UI back."""
    registry = open_registry(db_url, user)
    done = registry.sync(name)
    if as_json:
        print_json(done)
        return
    for item in done:
        aliases = ", ".join(f"{env}->v{mv}" for env, mv in item["aliases"].items() if mv) or "-"
        click.echo(f"{item['pair']}: {len(item['runs'])} validation run(s), model version "
                   f"{item['model_version'] or '-'}, approval {item['approval'] or '-'}, aliases {aliases}")
    click.echo(f"MLflow at {registry.review().tracking_uri} is up to date")


@cli.command()
@click.argument("name", required=False)
@click.option("--port", type=int, default=5000, show_default=True)
@click.option("--host", default="127.0.0.1", show_default=True)
def ui(name, port, host):
    """Serve the MLflow UI on the embedded store and print the URL of pair NAME's model."""
    import os
    import subprocess

    from specreg.registry.mlflow_sync import MlflowSync, registered_model_url, ui_command

    mlflow = MlflowSync(click.get_current_context().find_root().params.get("mlflow_uri"))
    argv = ui_command(mlflow.tracking_uri, host=host, port=port)
    base = f"http://{host}:{port}"
    click.echo(f"MLflow UI: {registered_model_url(base, mlflow.registered_model_name(name)) if name else base}")
    if os.name == "posix":
        os.execv(argv[0], argv)  # the server replaces this process: Ctrl-C stops it directly
    sys.exit(subprocess.run(argv, check=False).returncode)


# --- database -----------------------------------------------------------------------------

@cli.group()
def db() -> None:
    """Database schema commands."""


@db.command()
@db_option
def upgrade(db_url):
    """Migrate the registry database to this specreg's schema."""
    from specreg import settings
    from specreg.registry.store import Store, safe_url

    url = db_url or settings.default_db_url()
    store = Store(url, check=False)
    before = store.current_revision()
    store.upgrade()
    click.echo(f"database {safe_url(url)}: schema {before or 'empty'} -> {store.current_revision()}")


@cli.command(name="demo-pair")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--force", is_flag=True, help="Rebuild even when a cached build matches.")
def demo_pair(directory, force):
    """Build (or reuse) the tiny demo target/draft pair in DIRECTORY (about 30 s on 2 idle CPU cores)."""
    from specreg.runtime.demo_pair import build_demo_pair

    target_dir, draft_dir = build_demo_pair(directory, force=force, log=lambda line: click.echo(line, err=True))
    click.echo(f"target: {target_dir}")
    click.echo(f"draft:  {draft_dir}")


def main() -> None:
    """Entry point: user errors become one line on stderr and an exit code, never a traceback."""
    try:
        try:
            code = cli.main(standalone_mode=False)
        finally:
            print_warnings()
    except click.exceptions.Abort:
        click.echo("specreg: aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except SpecregError as exc:
        click.echo(f"specreg: error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("specreg: interrupted", err=True)
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()

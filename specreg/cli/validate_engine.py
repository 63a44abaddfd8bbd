"""`specreg validate-engine NAME@V --engine ENGINE` (also spelled `specreg validate NAME@V --engine
ENGINE`): run it and print the parity table, the differences in the engine and the throughput
tiers (or --json). The options are EngineValidationRequest's fields, each defined once here with
the request's default, for both spellings."""

from __future__ import annotations

import sys

import click

from specreg.cli.root import (cli, db_option, echo_lines, golden_option, json_option, near_tie_option,
                              open_registry, print_json, print_table, say, user_option)
from specreg.core.statuses import EngineBaselineStatus
from specreg.engine_validation.request import DTYPES, EngineValidationRequest, default

# registry/deploy/engine_client.ENGINES, which the request checks against (named here too so that
# the CLI loads without the HTTP client)
ENGINE_CHOICES = ("llamacpp", "vllm", "sglang")
ENGINE_HELP = ("llamacpp, and vllm without --engine-url, start the engine here (`make llamacpp`, `make vllm`); "
               "sglang needs --engine-url.")
# each named as its EngineValidationRequest field; `--engine`, `--dtype` and `--near-tie-tolerance`
# are each command's own (`validate` shares them with our runtime's validation)
ENGINE_OPTIONS = (
    click.option("--engine-url", "engine_url", default=default("engine_url"), metavar="URL",
                 help="A vLLM / SGLang server someone else started (with the pair's draft): a GPU cluster, tensor "
                      "parallel."),
    click.option("--engine-reference-url", "reference_url", default=default("reference_url"), metavar="URL",
                 help="The same engine serving the target without speculation (equivalence)."),
    click.option("--engine-model", "model_name", default=default("model_name"), metavar="NAME",
                 help="The served model name (vLLM metrics label; default: the server's)."),
    click.option("--concurrency", "tiers", default=",".join(map(str, default("tiers"))), show_default=True,
                 metavar="LIST", help="Engine throughput tiers (llama-server -np)."),
    click.option("--parity-tolerance", "parity_tolerance", type=float, default=default("parity_tolerance"),
                 show_default=True, help="Largest |alpha_engine - alpha_ours| overall."),
    click.option("--engine-threads", "threads", type=int, default=default("threads"), metavar="N",
                 help="llama-server -t; a local vLLM's VLLM_CPU_OMP_THREADS_BIND: the first N CPUs (default: "
                      "llama.cpp's own choice; vLLM: every CPU this process may use)."),
    click.option("--engine-deadline", "deadline_s", type=float, default=default("deadline_s"), show_default=True,
                 metavar="SECONDS",
                 help="One engine request in all, connect to last byte (a stalled or trickling server fails then)."),
)


def engine_options(command):
    """``command`` with ENGINE_OPTIONS, in their order."""
    for option in reversed(ENGINE_OPTIONS):
        command = option(command)
    return command


def engine_request(**values) -> EngineValidationRequest:
    """The request from the options as click parsed them (``tiers``: --concurrency's comma list)."""
    from specreg.errors import UsageError

    try:
        tiers = tuple(int(part) for part in values["tiers"].split(",") if part.strip())
    except ValueError:
        raise UsageError(f"invalid --concurrency {values['tiers']!r}: comma-separated integers, e.g. 1,4") from None
    return EngineValidationRequest(**{**values, "tiers": tiers})


@cli.command("validate-engine")
@click.argument("ref", metavar="NAME@VERSION")
@click.option("--engine", type=click.Choice(ENGINE_CHOICES), required=True, help=f"The serving engine: {ENGINE_HELP}")
@golden_option
@click.option("--dtype", type=click.Choice(DTYPES), default=default("dtype"), show_default=True)
@near_tie_option
@engine_options
@db_option
@user_option
@json_option
def validate_engine(ref, golden, db_url, user, as_json, **request_options):
    """Validate a pair version in a serving engine and record its engine baseline: parity with our
    runtime, equivalence in the engine, tokens/s per concurrency tier; exit 0 passed, 100 failed
    or unaccepted, 1 error. The same as `specreg validate NAME@VERSION --engine ENGINE`."""
    registry = open_registry(db_url, user)
    run_engine_validation(registry, ref, engine_request(**request_options), golden=golden, as_json=as_json)


def _num(value, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _positions(values) -> str:
    return "-" if not values else " ".join(f"{v:.2f}" for v in values)


def run_engine_validation(registry, ref: str, request: EngineValidationRequest, *, golden: str | None,
                          as_json: bool = False) -> None:
    """Run ``request`` on ``ref`` over ``golden`` (None: the policy's) and print what it found."""
    from specreg.errors import PolicyViolation
    from specreg.runtime_validation import ValidationInterrupted

    from specreg.cli.progress import Progress

    progress = Progress(enabled=not as_json)
    try:
        outcome = registry.validate_engine(ref, request, golden=golden, progress=progress)
    except ValidationInterrupted as exc:
        progress.close()
        say(f"specreg: engine validation aborted by {exc.signal_name}; the server was stopped, nothing "
                   f"was recorded", err=True)
        sys.exit(128 + exc.signal_number)
    finally:
        progress.close()
    engine = request.engine
    baseline = outcome.baseline
    if as_json:
        print_json(baseline.to_dict())
    else:
        checks = {check.name: check for check in outcome.checks}
        parity = checks.get("engine_parity")
        if parity is not None and parity.evidence:
            print_table(["SCOPE", "ALPHA OURS", f"ALPHA {engine.upper()}", "|D|", "TAU OURS", f"TAU {engine.upper()}",
                         "PER-POSITION OURS", f"PER-POSITION {engine.upper()}"],
                        [[row["scope"], _num(row["alpha_ours"]), _num(row["alpha_engine"]), _num(row["alpha_delta"]),
                          _num(row["tau_ours"]), _num(row["tau_engine"]), _positions(row["per_position_ours"]),
                          _positions(row["per_position_engine"])] for row in parity.evidence["rows"]])
        equivalence = checks.get("engine_equivalence")
        differences = (equivalence.evidence or {}).get("differences", []) if equivalence is not None else []
        if differences:
            print_table(["PROMPT", "AT", "WITH DRAFT", "WITHOUT", f"{engine.upper()} MARGIN", "RUNTIME MARGIN", "NEAR-TIE"],
                        [[d["record"], d["position"], d["speculative_token_id"], d["target_only_token_id"],
                          _num(d.get("engine_margin"), 5), _num(d.get("runtime_margin"), 5),
                          "yes" if d["near_tie"] else "NO"] for d in differences])
        throughput = checks.get("engine_throughput")
        if throughput is not None and throughput.evidence:
            print_table(["CONCURRENCY", "TOK/S WITH DRAFT", "TOK/S WITHOUT", "SPEEDUP", f"ALPHA {engine.upper()}"],
                        [[t["concurrency"], _num(t.get("with_draft_tokens_per_s"), 1),
                          _num(t.get("without_draft_tokens_per_s"), 1), _num(t.get("speedup"), 2),
                          _num(t.get("acceptance_rate"))] for t in throughput.evidence["tiers"]])
        report = outcome.report
        if "engine_matches_runtime_counts" in report:
            say(f"prompt by prompt: {report['engine_matches_runtime_tokens']} of {report['prompts']} with the "
                       f"same tokens in {engine} as in our runtime, {report['engine_matches_runtime_counts']} with "
                       f"the same drafted / accepted / steps / per-position counts")
        print_table(["CHECK", "STATUS", "SUMMARY"], [[c.name, c.status, c.summary] for c in outcome.checks])
        echo_lines([f"{baseline.label}: engine baseline {baseline.id} on {baseline.stamp} {baseline.status} "
                    f"(golden set {baseline.golden_set}, {outcome.report.get('seconds')} s)"])
    if baseline.status == EngineBaselineStatus.UNACCEPTED:
        raise PolicyViolation(f"{baseline.label}: engine baseline {baseline.id} is unaccepted, "
                              f"{outcome.report.get('acceptance_reason')}: nothing uses it until an approver runs "
                              f"`specreg engine-baselines accept {baseline.label} {baseline.id} --key FILE`")
    if not outcome.passed:
        raise PolicyViolation(f"{baseline.label} failed validation in {engine}: {outcome.report.get('reason')}")

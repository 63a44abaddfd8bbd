"""`specreg validate NAME@V --engine ENGINE`: run it and print the parity table, the differences
in the engine and the throughput tiers (or --json)."""

from __future__ import annotations

import sys

import click

from specreg.cli.root import echo_lines, print_json, print_table, say
from specreg.core.statuses import EngineBaselineStatus


def _num(value, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _positions(values) -> str:
    return "-" if not values else " ".join(f"{v:.2f}" for v in values)


def run_engine_validation(registry, ref: str, *, engine: str, golden: str | None, engine_url, reference_url, model_name,
                          tiers, parity_tolerance, near_tie_tolerance, dtype, threads=None, deadline_s: float = 600.0,
                          as_json: bool = False) -> None:
    from specreg.errors import PolicyViolation
    from specreg.runtime_validation import ValidationInterrupted

    from specreg.cli.progress import Progress

    progress = Progress(enabled=not as_json)
    try:
        outcome = registry.validate_engine(ref, engine=engine, golden=golden, engine_url=engine_url,
                                           reference_url=reference_url, model_name=model_name, concurrency=tiers,
                                           parity_tolerance=parity_tolerance, near_tie_tolerance=near_tie_tolerance,
                                           dtype=dtype, threads=threads, deadline_s=deadline_s, progress=progress)
    except ValidationInterrupted as exc:
        progress.close()
        say(f"specreg: engine validation aborted by {exc.signal_name}; the server was stopped, nothing "
                   f"was recorded", err=True)
        sys.exit(128 + exc.signal_number)
    finally:
        progress.close()
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

"""Validation: `specreg validate` runs the checks on a pair version and writes its reports."""

from __future__ import annotations

import sys

import click

from specreg.cli.root import (cli, db_option, golden_option, json_option, near_tie_option, open_registry,
                              print_json, print_table, say, user_option)
from specreg.cli.validate_engine import (ENGINE_CHOICES, ENGINE_HELP, engine_options, engine_request,
                                         run_engine_validation)
from specreg.runtime.sampling import DRAFT_SAMPLING
from specreg.validators.suite import ValidationOptions as Defaults  # the one home of validate's defaults


@cli.command()
@click.argument("ref", metavar="NAME@VERSION")
@golden_option
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda", "mps"]), default=Defaults.device, show_default=True)
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default=Defaults.dtype, show_default=True)
@click.option("--checks", default=None, metavar="LIST", help="Comma-separated subset: integrity,tokenizer,chat_template,memory,equivalence,distribution,acceptance,performance.")
@click.option("--gpu-memory", default=None, metavar="SIZE", help="Device memory budget, e.g. 80GiB (default: the CUDA device's).")
@click.option("--acceptance-tolerance", type=float, default=None,
              help="Relative acceptance drop vs the previous validated version that fails (default: the policy's).")
@near_tie_option
@click.option("--distribution-samples", type=int, default=Defaults.distribution_samples, show_default=True,
              help="Draws per prefix for the distribution check.")
@click.option("--draft-sampling", type=click.Choice(DRAFT_SAMPLING), default=Defaults.draft_sampling,
              show_default=True, help="How sampled golden records draft: greedy (argmax draft, point-mass q: vLLM's, "
              "SGLang's and llama.cpp's default) or probabilistic (drafts drawn from q: vLLM's draft_sample_method).")
@click.option("--runtime-batch", type=int, default=Defaults.runtime_batch_size, show_default=True, metavar="N", help="Golden prompts our runtime decodes at once (speed figures say the batch size; latency is measured at batch 1 too).")
@click.option("--report", "report_path", default=None, metavar="FILE", help="Write the HTML report.")
@click.option("--markdown", "markdown_path", default=None, metavar="FILE", help="Write a Markdown summary (e.g. $GITHUB_STEP_SUMMARY).")
@click.option("--junit", "junit_path", default=None, metavar="FILE", help="Write JUnit XML: one testcase per check.")
@click.option("--engine", type=click.Choice(ENGINE_CHOICES), default=None,
              help=f"Validate in a serving engine instead (`specreg validate-engine`): {ENGINE_HELP}")
@engine_options
@db_option
@user_option
@json_option
def validate(ref, golden, device, dtype, checks, gpu_memory, acceptance_tolerance, near_tie_tolerance,
             distribution_samples, draft_sampling, runtime_batch, report_path, markdown_path, junit_path, engine, db_url,
             user, as_json, **engine_only):
    """Validate a pair version on golden prompts; exit 0 pass, 100 a check failed, 1 error.

    With --engine: run the golden prompts through a serving engine and record the pair's engine
    baseline (parity with our runtime, equivalence in the engine, tokens/s per concurrency tier),
    as `specreg validate-engine` does."""
    from specreg.errors import PolicyViolation, SpecregError, UsageError
    from specreg.registry.store.validations import ERROR
    from specreg.registry.review import reports
    from specreg.runtime_validation import ValidationInterrupted

    registry = open_registry(db_url, user)
    if engine is not None:
        if report_path or markdown_path or junit_path or checks:
            raise UsageError("--report/--markdown/--junit/--checks apply to our runtime's validation, not --engine")
        request = engine_request(engine=engine, dtype=dtype, near_tie_tolerance=near_tie_tolerance, **engine_only)
        run_engine_validation(registry, ref, request, golden=golden, as_json=as_json)
        return
    if engine_only["engine_url"] or engine_only["reference_url"] or engine_only["model_name"]:
        raise UsageError("--engine-url / --engine-reference-url / --engine-model need --engine")
    # a report path that cannot be written fails now, not after the run was recorded
    for option, path in (("--report", report_path), ("--markdown", markdown_path), ("--junit", junit_path)):
        if path:
            reports.check_writable(path, option)
    from specreg.cli.progress import Progress

    # the policy in effect decides what the run is judged on, unless told otherwise (said at the end)
    request = registry.validation_request(ref, golden=golden, device=device, dtype=dtype, checks=checks,
                                          gpu_memory=gpu_memory, acceptance_tolerance=acceptance_tolerance,
                                          near_tie_tolerance=near_tie_tolerance,
                                          distribution_samples=distribution_samples, runtime_batch=runtime_batch,
                                          draft_sampling=draft_sampling)
    progress = Progress(enabled=not as_json, title=f"validate {ref}")
    try:
        outcome = registry.run_validation(request, progress=progress)
    except ValidationInterrupted as exc:
        say(f"specreg: validation aborted by {exc.signal_name}; the pair's state is unchanged", err=True)
        sys.exit(128 + exc.signal_number)
    finally:
        progress.close()
    run, version = outcome.run, outcome.version
    for option, path, render in (("--report", report_path, lambda: reports.render_html(run, version)),
                                 ("--markdown", markdown_path, lambda: reports.render_markdown(run, version)),
                                 ("--junit", junit_path, lambda: reports.render_junit(run))):
        if path:
            reports.write_text(path, render(), option)
    if as_json:
        print_json({**run.to_dict(), "state": version.state.value, "policy": request.policy_source,
                    "acceptance_tolerance": request.options.acceptance_tolerance})
    else:
        print_table(["CHECK", "STATUS", "SUMMARY"], [[c.name, c.status, c.summary] for c in run.checks])
        say(f"{run.label}: validation run {run.id} {run.status} on golden set {run.golden_set}; "
                   f"state {version.state.value}")
        if request.policy_source is not None:
            say(f"golden set and acceptance tolerance ({request.options.acceptance_tolerance:.0%}) from "
                f"{request.policy_source}, environment {request.environment}")
    if run.status == ERROR:  # a check could not run: no verdict on the pair, exit 1 (not 100)
        raise SpecregError(f"{run.label}: validation run {run.id} could not judge the pair: {run.error}")
    if not outcome.passed:
        why = f"{', '.join(run.failed_checks)} failed" if run.failed_checks else (run.summary or {}).get("reason")
        raise PolicyViolation(f"{run.label} failed validation run {run.id}: {why or 'see the run'}")

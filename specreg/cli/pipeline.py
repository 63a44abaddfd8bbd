"""Pipelines: the gate's JSON as the step outputs and job summary a CI runner reads (action.yml,
the GitLab template in ci/)."""

from __future__ import annotations

import json

import click

from specreg.cli.root import cli


# a gate's JSON and Markdown are a few kilobytes a condition; a lock names every model file
MAX_GATE_FILE_BYTES = 16 * 1024 * 1024
MAX_LOCK_FILE_BYTES = 64 * 1024 * 1024


@cli.command(name="ci-outputs")
@click.argument("gate_json", metavar="GATE_JSON")
@click.option("--style", type=click.Choice(["github", "dotenv"]), required=True,
              help="github: $GITHUB_OUTPUT lines (name=value, heredoc for several lines); "
                   "dotenv: a GitLab artifacts:reports:dotenv file (SPECREG_NAME=value).")
@click.option("--lock", "lock_path", default=None, metavar="FILE",
              help="The pair lock the pipeline deploys: it must bind the gated version (else the verdict is "
                   "refused, exit 100); its sha256 is lock_digest.")
@click.option("--output", "output_path", default=None, metavar="FILE",
              help="github: append the outputs to FILE (e.g. $GITHUB_OUTPUT); dotenv: write FILE, which must not "
                   "exist. Never through a symlink.")
@click.option("--markdown", "markdown_path", default=None, metavar="FILE",
              help="The gate's --markdown report, to append to --summary.")
@click.option("--summary", "summary_path", default=None, metavar="FILE",
              help="Append the report here (e.g. $GITHUB_STEP_SUMMARY), cut with a note below GitHub's 1 MiB.")
def ci_outputs(gate_json, style, lock_path, output_path, markdown_path, summary_path):
    """Turn `specreg gate --json` output into a runner's step outputs: verdict, pair, version,
    environment, binding, lock_digest, audit_head, reasons."""
    from specreg.ci_formats import dotenv, gate_outputs, github_output, step_summary
    from specreg.core.files import append_text, read_bounded, read_json_bounded, read_text_bounded, write_fresh
    from specreg.errors import PolicyViolation, UsageError

    if (markdown_path is None) != (summary_path is None):
        raise UsageError("--markdown and --summary go together: the report to append, and where")
    gate = read_json_bounded(gate_json, MAX_GATE_FILE_BYTES, "gate JSON", UsageError)
    if not isinstance(gate, dict) or "verdict" not in gate:
        raise UsageError(f"gate JSON {gate_json}: not the JSON of `specreg gate --json` (no verdict)")
    lock = None if lock_path is None else read_bounded(lock_path, MAX_LOCK_FILE_BYTES, "pair lock", UsageError)
    if summary_path is not None:  # the report first: it explains a refused lock too
        report = read_text_bounded(markdown_path, MAX_GATE_FILE_BYTES, "gate report", UsageError)
        append_text(summary_path, step_summary(report), "--summary")
    outputs = gate_outputs(gate, lock, lock_path or "")
    text = github_output(outputs) if style == "github" else dotenv(outputs)
    if output_path is None:
        click.echo(text, nl=False)
    elif style == "github":  # the runner's file, which other steps append to as well
        append_text(output_path, text, "--output")
    else:  # a dotenv report is one job's whole file: lines left there beforehand would count too
        write_fresh(output_path, text, "--output", overwrite=False)
    if outputs["lock_digest"] == "" and lock is not None and outputs["binding"]:
        raise PolicyViolation(outputs["reasons"].split("\n")[-1])

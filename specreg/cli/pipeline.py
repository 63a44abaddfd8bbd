"""Pipelines: the gate's JSON as the step outputs and job summary a CI runner reads (action.yml,
the GitLab template in ci/)."""

from __future__ import annotations

import json

import click

from specreg.cli.root import cli


@cli.command(name="ci-outputs")
@click.argument("gate_json", metavar="GATE_JSON")
@click.option("--style", type=click.Choice(["github", "dotenv"]), required=True,
              help="github: $GITHUB_OUTPUT lines (name=value, heredoc for several lines); "
                   "dotenv: a GitLab artifacts:reports:dotenv file (SPECREG_NAME=value).")
@click.option("--lock", "lock_path", default=None, metavar="FILE",
              help="The pair lock the pipeline deploys: it must bind the gated version; its sha256 is lock_digest.")
@click.option("--output", "output_path", default=None, metavar="FILE",
              help="Append the outputs to FILE (e.g. $GITHUB_OUTPUT) instead of printing them.")
@click.option("--markdown", "markdown_path", default=None, metavar="FILE",
              help="The gate's --markdown report, to append to --summary.")
@click.option("--summary", "summary_path", default=None, metavar="FILE",
              help="Append the report here (e.g. $GITHUB_STEP_SUMMARY), cut with a note below GitHub's 1 MiB.")
def ci_outputs(gate_json, style, lock_path, output_path, markdown_path, summary_path):
    """Turn `specreg gate --json` output into a runner's step outputs: verdict, pair, version,
    environment, binding, lock_digest, audit_head, reasons."""
    from specreg.errors import UsageError
    from specreg.ci_formats import dotenv, gate_outputs, github_output, step_summary

    if (markdown_path is None) != (summary_path is None):
        raise UsageError("--markdown and --summary go together: the report to append, and where")
    try:
        with open(gate_json, encoding="utf-8") as handle:
            gate = json.load(handle)
    except (OSError, ValueError) as exc:
        raise UsageError(f"{gate_json}: not the JSON of `specreg gate --json` ({exc})") from None
    if not isinstance(gate, dict) or "verdict" not in gate:
        raise UsageError(f"{gate_json}: not the JSON of `specreg gate --json` (no verdict)")
    if summary_path is not None:  # the report first: it explains a refused lock too
        try:
            with open(markdown_path, encoding="utf-8") as source:
                report = source.read()
        except OSError as exc:
            raise UsageError(f"{markdown_path}: cannot read the gate's report ({exc.strerror or exc})") from None
        with open(summary_path, "a", encoding="utf-8") as summary:
            summary.write(step_summary(report))
    outputs = gate_outputs(gate, lock_path)
    text = github_output(outputs) if style == "github" else dotenv(outputs)
    if output_path is None:
        click.echo(text, nl=False)
    else:
        with open(output_path, "a", encoding="utf-8") as handle:
            handle.write(text)

"""Deployment: exports for the serving engines and live observation against the baselines."""

from __future__ import annotations

import sys

import click

from specreg.cli.common import cli, db_option, fmt_number, json_option, open_registry, print_json, print_table


@cli.command()
@click.argument("ref", metavar="NAME@VERSION|NAME@ENV")
@click.option("--format", "fmt", required=True,
              type=click.Choice(["vllm", "sglang", "trtllm", "tgi", "k8s-vllm", "prometheus-rules"]))
@click.option("-o", "--output", "out_dir", default=None, metavar="DIR", help="Write the files here (default: print them).")
@click.option("--template", default=None, metavar="PATH", help="Render this Jinja2 template (sandboxed) instead.")
@click.option("--option", "option_pairs", multiple=True, metavar="KEY=VALUE",
              help="Override an export option (port, tensor_parallel_size, tolerance, for, image, engine_version, "
                   "max_num_seqs; k8s-vllm: model_volume=pvc:CLAIM|hostPath:/DIR, model_mount_path, "
                   "target_subpath, draft_subpath, ...).")
@click.option("--force", is_flag=True, help="Export a version that is not validated and approved (marked UNAPPROVED).")
@click.option("--overwrite", is_flag=True, help="Replace files that already exist in the output folder.")
@db_option
@json_option
def export(ref, fmt, out_dir, template, option_pairs, force, overwrite, db_url, as_json):
    """Write deployment configs for a serving engine, with the pair's identity and baselines."""
    from specreg.errors import UsageError

    options = {}
    for pair in option_pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"invalid --option {pair!r}: use KEY=VALUE")
        # A version stays text: 1.20 is not 1.2.
        options[key] = value if key == "engine_version" else yaml_scalar(value)
    files = open_registry(db_url).export(ref, fmt, out_dir=out_dir, force=force, overwrite=overwrite,
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

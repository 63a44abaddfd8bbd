"""Review in MLflow: sync the registry into MLflow and open its UI."""

from __future__ import annotations

import click

from specreg.cli.root import cli, db_option, json_option, open_registry, print_json, say, user_option
from specreg.errors import SpecregError


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
        say(f"{item['pair']}: {len(item['runs'])} validation run(s), model version "
                   f"{item['model_version'] or '-'}, approval {item['approval'] or '-'}, aliases {aliases}")
    say(f"MLflow at {registry.review.tracking_uri} is up to date")


@cli.command()
@click.argument("name", required=False)
@click.option("--port", type=int, default=5000, show_default=True)
@click.option("--host", default="127.0.0.1", show_default=True)
def ui(name, port, host):
    """Serve the MLflow UI on the embedded store and print the URL of pair NAME's model; Ctrl-C
    stops it and every process it started. The server's own output goes to a log file."""
    from specreg.registry.review.mlflow_ui import (health_url, last_line, local_artifact_root, port_taken,
                                                   registered_model_url, serve_ui, ui_command)
    from specreg.registry.review.mlflow_sync import MlflowSync

    mlflow = MlflowSync(click.get_current_context().find_root().params.get("mlflow_uri"))
    argv = ui_command(mlflow.tracking_uri, host=host, port=port)
    base = f"http://{host}:{port}"
    log = local_artifact_root(mlflow.tracking_uri).parent / "ui.log"  # beside the store it serves
    # a URL printed while another process holds the port would show that process's pages (on a
    # shared host, someone else's MLflow): refuse before starting, and print the URL only once
    # the server started here answers
    if port_taken(host, port):
        raise SpecregError(f"port {port} on {host} is taken by another process: choose a free one with --port")
    say(f"starting one MLflow server process (log: {log}); Ctrl-C stops it")

    def ready() -> None:
        say(f"MLflow UI: {registered_model_url(base, mlflow.registered_model_name(name)) if name else base}")

    code, answered = serve_ui(argv, log, health=health_url(host, port), on_ready=ready)
    if code is None:
        say("MLflow UI stopped, with every process it started")
    elif code != 0 or not answered:
        said = last_line(log)
        raise SpecregError(f"the MLflow server exited with code {code}"
                           + ("" if answered else " before it served the UI") + f": see {log}"
                           + (f" (last line: {said})" if said else ""))

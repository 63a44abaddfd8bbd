"""`specreg engine-baselines`: a version's engine baselines, whether each counts, and accepting one
whose acceptance differs from our runtime's (an approver's signature, as for an approval)."""

from __future__ import annotations

import click

from specreg.cli.root import cli, db_option, json_option, open_registry, print_json, print_table, user_option


@cli.group(name="engine-baselines")
def engine_baselines() -> None:
    """Engine baselines (`specreg validate NAME@V --engine ENGINE`): list, accept."""


@engine_baselines.command(name="list")
@click.argument("ref", metavar="NAME@VERSION")
@db_option
@json_option
def list_baselines(ref, db_url, as_json):
    """Every engine baseline of a version, oldest first, and whether it counts (exports, alert
    rules, observe and the gate use only those that do)."""
    judged = open_registry(db_url).engine_baseline_standings(ref)
    if as_json:
        print_json([standing.to_dict() for standing in judged])
        return
    print_table(["ID", "ENGINE", "STAMP", "STATUS", "ALPHA", "COUNTS", "WHY"],
                [[s.row.id, s.row.engine, f"{s.row.engine_version} ({s.row.engine_build})"[:60], s.row.status,
                  _alpha(s.row.baselines), "yes" if s.counts else "NO", s.why] for s in judged])


@engine_baselines.command(name="accept")
@click.argument("ref", metavar="NAME@VERSION")
@click.argument("baseline_id", metavar="ID", type=int)
@click.option("--key", envvar="SPECREG_APPROVAL_KEY", default=None, metavar="FILE",
              help="Your private key (enrolled to you); the acceptance is your signature.")
@click.option("--note", default=None, help="Why the engine's figures are right; kept with the acceptance.")
@db_option
@user_option
@json_option
def accept(ref, baseline_id, key, note, db_url, user, as_json):
    """Accept an unaccepted engine baseline (its acceptance rate differs from our runtime's beyond
    the parity tolerance): from then on it is the version's baseline for that engine. Never by the
    pair's registrant nor by whoever ran that engine validation."""
    standing = open_registry(db_url, user).accept_engine_baseline(ref, baseline_id, key=key, note=note)
    if as_json:
        print_json(standing)
    else:
        click.echo(f"{ref}: engine baseline {baseline_id} {standing['why']}")


def _alpha(baselines) -> str:
    value = ((baselines or {}).get("overall") or {}).get("acceptance_rate")
    return "-" if not isinstance(value, (int, float)) else f"{value:.4f}"

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


def open_registry(db_url: str | None, user: str | None = None):
    from specreg.api import Registry

    return Registry(db_url, user=user)


def print_json(data) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False, default=str))


def print_table(headers: list[str], rows: list[list]) -> None:
    """A plain aligned table for people."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for index, row in enumerate(cells):
        click.echo("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
        if index == 0:
            click.echo("  ".join("-" * w for w in widths))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="specreg")
def cli() -> None:
    """specreg: register, validate, approve, promote and export speculative-decoding pairs."""


def main() -> None:
    """Entry point: user errors become one line on stderr and an exit code, never a traceback."""
    try:
        cli.main(standalone_mode=False)
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


if __name__ == "__main__":
    main()

"""What every command shares: the root group, shared options, opening the registry, printing.

Heavy libraries (torch, transformers, mlflow) are imported inside the commands that need
them, never at module level: `specreg --help`, `list` and `show` stay fast.
"""


from __future__ import annotations

import json

import click

db_option = click.option(
    "--db", "db_url", envvar="SPECREG_DB", default=None, metavar="URL",
    help="SQLAlchemy URL of the registry database (default: $SPECREG_HOME/registry.db).",
)
user_option = click.option(
    "--user", "user", envvar="SPECREG_USER", default=None,
    help="Who acts (default: $SPECREG_USER or the OS user).",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for machines.")
policy_option = click.option(
    "--policy", "policy_path", default=None, metavar="FILE",
    help="Preview a policy file (TOML or YAML): shown beside the verdict, never deciding it; the registry's "
         "policy of record decides (`specreg policy show`).",
)
golden_option = click.option(
    "--golden", default=None, metavar="SET|PATH",
    help="Shipped golden set name or a .yaml/.jsonl file (default: the policy's, see `specreg policy show`).",
)
near_tie_option = click.option(
    "--near-tie-tolerance", type=float, default=None,
    help="Logit margin below which a greedy divergence is a near-tie (default by dtype).",
)
PREVIEW_ONLY = ("--policy only previews: {what} is judged under the registry's policy of record "
                "(`specreg policy show`); preview with `specreg gate NAME@V --env ENV --policy FILE`, "
                "change it with `specreg policy propose FILE`")


OPENED_REGISTRIES: list = []  # their warnings (e.g. "MLflow is behind") are printed at exit


def open_registry(db_url: str | None, user: str | None = None):
    import os

    from specreg.api import Registry

    context = click.get_current_context(silent=True)
    mlflow_uri = context.find_root().params.get("mlflow_uri") if context else None
    registry = Registry(db_url, user=user, mlflow_uri=mlflow_uri)
    if os.environ.get("SPECREG_POLICY") and not OPENED_REGISTRIES:
        registry.warnings.append(f"$SPECREG_POLICY ({os.environ['SPECREG_POLICY']}) is ignored: the registry's policy "
                                 f"of record decides (`specreg policy show`; `specreg policy propose FILE` to change it)")
    OPENED_REGISTRIES.append(registry)
    return registry


def print_warnings() -> None:
    for registry in OPENED_REGISTRIES:
        for warning in registry.warnings:
            echo_err([f"specreg: warning: {printable(warning)}"])
        registry.warnings.clear()


def wrapped(lines: list[str], width: int | None) -> list[str]:
    """``lines`` fitted to ``width`` columns (None: as they are): a continuation is indented two
    spaces past its line's own indent."""
    import textwrap

    out = []
    for line in lines:
        if width is None or len(line) <= width:
            out.append(line)
            continue
        indent = " " * min(len(line) - len(line.lstrip(" ")) + 2, width // 2)
        out += textwrap.wrap(line, width, subsequent_indent=indent, break_on_hyphens=False,
                             break_long_words=True) or [line]
    return out


def echo_err(lines: list[str]) -> None:
    """Lines for people on stderr (already ``printable``), wrapped to the terminal when stderr is
    one."""
    import shutil
    import sys

    width = shutil.get_terminal_size((100, 24)).columns if sys.stderr.isatty() else None
    click.echo("\n".join(wrapped(lines, width)), err=True)


def say(text: str, err: bool = False) -> None:
    """One message for people on stdout (``err``: stderr), made ``printable`` and wrapped to the
    terminal when that stream is one (in a pipe or a log: one line, for tools)."""
    if err:
        echo_err([printable(text)])
    else:
        echo_lines([text])


def print_json(data) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False, default=str))


def printable(text) -> str:
    """``text`` safe for a terminal line: control, format and line-separator characters
    (newlines, ESC sequences, bidi overrides) are shown escaped (``\\n``, ``\\x1b``,
    ``\\u202e``), so a note or user name can neither forge a line nor drive the terminal.
    Every table and line printer of the CLI passes user-supplied text through here."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else char.encode("unicode_escape").decode("ascii")
                   for char in text)


def echo_lines(lines: list[str]) -> None:
    """Print lines for people, each made ``printable`` and fitted to ``output_width()`` (one write)."""
    click.echo("\n".join(wrapped([printable(line) for line in lines], output_width())))


def output_width() -> int | None:
    """The width tables must fit: the terminal's when stdout is one, else $COLUMNS if set, else
    None (a pipe or a CI log: lines are not wrapped, so tools can parse them)."""
    import os
    import shutil
    import sys

    if sys.stdout.isatty():
        return shutil.get_terminal_size((100, 24)).columns
    columns = os.environ.get("COLUMNS", "")
    return int(columns) if columns.isdigit() and int(columns) > 0 else None


def table_lines(headers: list[str], rows: list[list], width: int | None = None,
                wrap: tuple[int, ...] = ()) -> list[str]:
    """A plain aligned table for people, every cell made ``printable``. With a ``width`` the
    table fits it: the columns named in ``wrap`` (values compared side by side) share the room the
    others leave, each cell wrapped within its own column; otherwise the last column (the long
    details) is wrapped under its row, beside the other columns or, when they leave it under 30
    characters, on indented lines below the row."""
    import textwrap

    cells = [[printable(h) for h in headers]] + [["" if c is None else printable(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lead = sum(widths[:-1]) + 2 * (len(widths) - 1)  # where the last column starts
    if width is None or lead + widths[-1] <= width:
        lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in cells]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return lines
    shared = shared_widths(widths, wrap, width)
    if shared is not None:
        lines = []
        for index, row in enumerate(cells):
            parts = [textwrap.wrap(cell, shared[i], break_on_hyphens=False) or [""] if i in wrap else [cell]
                     for i, cell in enumerate(row)]
            for depth in range(max(len(part) for part in parts)):
                lines.append("  ".join((part[depth] if depth < len(part) else "").ljust(shared[i])
                                       for i, part in enumerate(parts)).rstrip())
            if index == 0:
                lines.append("  ".join("-" * w for w in shared))
        return lines
    beside = width - lead >= 30
    room = width - lead if beside else width - 4
    lines = []
    for index, row in enumerate(cells):
        head = "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:-1]))
        wrapped = textwrap.wrap(row[-1], room, break_on_hyphens=False) or [""]
        if beside:
            lines.append((head + "  " + wrapped[0]).rstrip())
            lines += [" " * lead + part for part in wrapped[1:]]
        else:
            lines.append(head.rstrip())
            lines += ["    " + part for part in wrapped if part]
        if index == 0:
            lines.append("  ".join("-" * w for w in widths[:-1]) + "  " + "-" * min(widths[-1], max(room, 1)))
    return [line[:width] if len(line) > width else line for line in lines]


# the narrowest a shared column is wrapped to; below it the details go under their rows instead
MIN_SHARED_WIDTH = 12


def shared_widths(widths: list[int], wrap: tuple[int, ...], width: int) -> list[int] | None:
    """The column widths when the ``wrap`` columns share what the others leave of ``width``: a
    column narrower than its share keeps its width and hands the rest on; None when a share would
    fall under MIN_SHARED_WIDTH."""
    if not wrap:
        return None
    room = width - sum(w for i, w in enumerate(widths) if i not in wrap) - 2 * (len(widths) - 1)
    fitted, waiting = list(widths), sorted(wrap, key=lambda i: widths[i])
    while waiting:
        share = room // len(waiting)
        if share < MIN_SHARED_WIDTH:
            return None
        if widths[waiting[0]] <= share:
            room -= widths[waiting.pop(0)]
            continue
        for i in waiting:
            fitted[i] = share
        break
    return fitted


def print_table(headers: list[str], rows: list[list], wrap: tuple[int, ...] = ()) -> None:
    """``table_lines`` fitted to ``output_width()``, in one write (10,000 separate echoes cost a
    third of `list`)."""
    click.echo("\n".join(table_lines(headers, rows, output_width(), wrap)))


class HelpGroup(click.Group):
    """A command group whose command list shows each command's first sentence whole, wrapped to
    the terminal, instead of click's summary cut with '...'. Its sub-groups are HelpGroups too."""

    group_class = type

    def format_commands(self, ctx, formatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit=10_000)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


@click.group(cls=HelpGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="specreg")
@click.option("--mlflow-uri", envvar="MLFLOW_TRACKING_URI", default=None, metavar="URI",
              help="MLflow tracking URI for review (default: the local store in $SPECREG_HOME/mlflow).")
def cli(mlflow_uri) -> None:
    """specreg: register, validate, approve, promote and export speculative-decoding pairs."""


def fmt_number(value) -> str:
    return "-" if value is None else f"{value:.4f}"

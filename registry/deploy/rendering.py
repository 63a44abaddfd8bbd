"""What renders an export's templates: the quoting filters shared by the shipped and the user
templates (every value a template writes goes through one: ``shquote``, ``shell_lines``, ``json``,
``yaml``, ``comment``), and the sandbox a user template renders in."""

from __future__ import annotations

import json
import math
import re
import shlex
from pathlib import Path
from typing import Any

from specreg.core.files import read_text_bounded
from specreg.errors import SpecregError

MAX_TEMPLATE_BYTES = 1024 * 1024  # a serve script's template: a few kilobytes




def shell_word(word: Any) -> str:
    """One word, quoted; {"export_dir": NAME} is NAME inside the folder of the script itself
    ("$EXPORT_DIR"/NAME: the template sets EXPORT_DIR), for files the export writes beside it."""
    if isinstance(word, dict) and set(word) == {"export_dir"}:
        return '"$EXPORT_DIR"/' + shlex.quote(str(word["export_dir"]))
    return shlex.quote(str(word))


def shell_lines(lines: list[list[str]]) -> str:
    """One command over several lines: each inner list is quoted word by word (shell_word) and the
    lines are joined with backslash continuations."""
    return " \\\n    ".join(" ".join(shell_word(word) for word in words) for words in lines)


def to_json(value: Any, indent: int | None = None) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=False)


def to_yaml_scalar(value: Any) -> str:
    """A YAML flow value on one line: strings double-quoted by the YAML emitter itself
    (escapes newlines, quotes and colons), everything else as JSON, which YAML reads too."""
    import yaml

    if isinstance(value, str):
        return yaml.safe_dump(value, default_style='"', width=math.inf, allow_unicode=True).strip()
    return json.dumps(value)


def one_line(value: Any) -> str:
    """Text safe inside a one-line comment: a newline would end the comment."""
    return re.sub(r"[\r\n\x0b\x0c\x85\u2028\u2029]+", " ", str(value))


FILTERS = {
    "shquote": lambda value: shlex.quote(str(value)),
    "shell_lines": shell_lines,
    "json": to_json,
    "yaml": to_yaml_scalar,
    "comment": one_line,
}


def render_user_template(template_path: Path, context: dict[str, Any]) -> tuple[str, str]:
    """Render a user template in Jinja2's sandbox; returns (output file name, text).

    The output name is the template's file name without a trailing ``.j2``. HTML and XML
    outputs are autoescaped. Anything the sandbox refuses (Python internals such as
    ``''.__class__``), a syntax error or an undefined name becomes one SpecregError line.
    """
    from jinja2 import StrictUndefined, TemplateSyntaxError
    from jinja2.exceptions import SecurityError
    from jinja2.sandbox import SandboxedEnvironment

    source = read_text_bounded(template_path, MAX_TEMPLATE_BYTES, "template")
    out_name = template_path.name[: -len(".j2")] if template_path.name.endswith(".j2") else template_path.name
    escape = out_name.lower().endswith((".html", ".htm", ".xml", ".svg"))
    env = SandboxedEnvironment(
        undefined=StrictUndefined, autoescape=escape, trim_blocks=True, lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters.update(FILTERS)
    try:
        text = env.from_string(source).render(context)
    except SecurityError as exc:
        raise SpecregError(f"template {template_path}: refused by the sandbox: {exc}") from None
    except TemplateSyntaxError as exc:
        raise SpecregError(f"template {template_path}:{exc.lineno}: syntax error: {exc.message}") from None
    except Exception as exc:  # a user template is user input: any failure is theirs, one line
        first_line = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise SpecregError(f"template {template_path}: {type(exc).__name__}: {first_line}") from None
    return out_name, text

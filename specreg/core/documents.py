"""Bounds on user documents (golden sets, policies) checked before a parser builds them.

A YAML file of a few hundred bytes can expand to gigabytes through aliases ("billion laughs"),
and deeply nested YAML, JSON or TOML ends in a RecursionError. Each document is refused with
one line naming the file unless it is at most ``max_bytes`` long, nests at most ``max_depth``
containers and, for YAML, uses no aliases (nothing specreg reads needs them).
"""

from __future__ import annotations

from typing import Any

MAX_DOCUMENT_BYTES = 16 * 1024 * 1024
MAX_DOCUMENT_DEPTH = 32
# mappings and lists in one YAML document: building Python objects for each costs far more than
# scanning it, so a 16 MiB file of tiny mappings is refused after the scan (about a second)
MAX_DOCUMENT_CONTAINERS = 250_000


def safe_loader():
    """PyYAML's SafeLoader in C (libyaml) where PyYAML was built with it: the pure-Python parser
    reads about 80 KB a second, the C one some 10 MB."""
    import yaml

    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def yaml_problem(text: str, max_depth: int = MAX_DOCUMENT_DEPTH,
                 max_containers: int = MAX_DOCUMENT_CONTAINERS) -> str | None:
    """Scan YAML events (no objects are built) for aliases, nesting deeper than ``max_depth``
    and more than ``max_containers`` mappings and lists; a one-line reason or None. Raises
    yaml.YAMLError for malformed YAML, which the caller reports as it already does."""
    import yaml

    try:
        return _scan(text, max_depth, max_containers)
    except yaml.YAMLError as exc:
        # libyaml stops at its own nesting limit (1000 levels), sometimes before this scan sees 33
        if "increasing flow level" in str(exc) or "increasing block level" in str(exc):
            return f"nested deeper than {max_depth} levels"
        raise


def _scan(text: str, max_depth: int, max_containers: int) -> str | None:
    import yaml

    depth = containers = 0
    for event in yaml.parse(text, Loader=safe_loader()):
        if isinstance(event, yaml.AliasEvent):
            line = event.start_mark.line + 1 if event.start_mark else "?"
            return f"YAML alias *{event.anchor} at line {line}: aliases are not allowed"
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            containers += 1
            if containers > max_containers:
                line = event.start_mark.line + 1 if event.start_mark else "?"
                return f"more than {max_containers} mappings and lists (line {line})"
            if depth > max_depth:
                line = event.start_mark.line + 1 if event.start_mark else "?"
                return f"nested deeper than {max_depth} levels at line {line}"
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1
    return None


def depth_problem(value: Any, max_depth: int = MAX_DOCUMENT_DEPTH) -> str | None:
    """Nesting of a parsed document (checked without recursion): a reason or None."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > max_depth:
                return f"nested deeper than {max_depth} levels"
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return None


def one_line(text: str, limit: int) -> str:
    """``text`` on one line (whitespace runs as one space), cut to ``limit`` characters with "..."."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."

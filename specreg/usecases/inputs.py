"""What the user types, checked before any work: pair names and references (NAME, NAME@VERSION,
NAME@ENV), free text and number limits, the speculative config of a registration and the key a
signature is made with. Each refusal is a UsageError naming the field and the value."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from specreg.errors import UsageError
from specreg.registry.store.entities import SpecConfig, SpecMethod
from specreg.core.methods import METHODS, tree_methods

NAME_PATTERN = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
NGRAM_DEFAULT_LOOKUP = (1, 4)
# Limits checked here, so that SQLite (which stores anything) and PostgreSQL (which refuses
# what does not fit a column) accept the same inputs: actors are String(255) columns, numbers
# Integer (32-bit on PostgreSQL); notes and reasons are Text on both, capped to stay readable.
MAX_TEXT_LENGTH = 10_000
MAX_SPECULATIVE_TOKENS = 64  # acceptance falls as alpha^k: no engine drafts more per step
MAX_PROMPT_LOOKUP = 64
MAX_BATCH_SIZE = 1_000_000


@dataclass(frozen=True)
class PairRef:
    """``NAME``, ``NAME@VERSION`` or ``NAME@ENV`` as the user wrote it."""

    name: str
    version: int | None = None
    environment: str | None = None

    def __str__(self) -> str:
        if self.version is not None:
            return f"{self.name}@{self.version}"
        if self.environment is not None:
            return f"{self.name}@{self.environment}"
        return self.name


def check_name(name: str) -> str:
    if not NAME_PATTERN.fullmatch(name or ""):
        raise UsageError(f"invalid pair name {name!r}: use 1-64 of a-z 0-9 . _ - starting with a letter or digit")
    return name


def check_text(field: str, value: str | None, limit: int = MAX_TEXT_LENGTH) -> str | None:
    """Refuse a free-text value (notes, reason) longer than ``limit`` characters."""
    if value is not None and len(value) > limit:
        raise UsageError(f"{field} is {len(value)} characters long, over the limit of {limit}")
    return value


def check_range(field: str, value: int | None, low: int, high: int) -> int | None:
    """Refuse an integer option outside [low, high] (None passes: not given)."""
    if value is not None and not low <= value <= high:
        raise UsageError(f"invalid {field} {value}: use {low} to {high}")
    return value


# pair_versions.version is an SQL INTEGER: 32 bits on PostgreSQL, so no version is above this
MAX_VERSION = 2**31 - 1


def record_number(field: str, value: int, low: int = 1) -> int:
    """``value``, an integer the database is asked about (a version, a row id, a limit), once it
    lies in [low, MAX_VERSION]: past that no row can have it, and the drivers overflow (SQLite's
    past 64 bits) rather than answer. UsageError naming ``field`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageError(f"invalid {field} {str(value)[:40]!r}: expected a whole number")
    if not low <= value <= MAX_VERSION:
        shown = value if abs(value) <= 2**64 else "a number that long"  # str() of 5000 digits raises
        raise UsageError(f"invalid {field} {shown}: use {low} to {MAX_VERSION}")
    return value


def parse_version(text: str, where: str) -> int | None:
    """A version number as typed ('7' or 'v7', ASCII digits) -> 7; None when ``text`` is not one.
    UsageError naming ``where`` for 0 or a number past MAX_VERSION (no version can have it, and
    the database could not even be asked: SQLite stops at 64 bits, PostgreSQL's INTEGER at 32)."""
    match = re.fullmatch(r"v?([0-9]+)", text)
    if match is None:
        return None
    digits = match.group(1).lstrip("0") or "0"
    if len(digits) > len(str(MAX_VERSION)) or int(digits) > MAX_VERSION:  # int() of 5000 digits raises
        raise UsageError(f"invalid version in {where}: past the largest version number, {MAX_VERSION}")
    if int(digits) < 1:
        raise UsageError(f"invalid version in {where}: versions start at 1")
    return int(digits)


def parse_ref(text: str) -> PairRef:
    """Parse NAME, NAME@VERSION (digits, optionally 'v'-prefixed) or NAME@ENV."""
    name, _, selector = text.partition("@")
    check_name(name)
    if not selector:
        if text.endswith("@"):
            raise UsageError(f"invalid reference {text!r}: nothing after '@'")
        return PairRef(name)
    version = parse_version(selector, repr(text) if len(text) <= 60 else repr(text[:40] + "..."))
    if version is not None:
        return PairRef(name, version=version)
    if re.fullmatch(r"[a-z][a-z0-9_-]{0,31}", selector):
        return PairRef(name, environment=selector)
    raise UsageError(f"invalid reference {text!r}: expected NAME, NAME@VERSION or NAME@ENVIRONMENT")


def parse_method(method: str) -> SpecMethod:
    try:
        return SpecMethod(method)
    except ValueError:
        raise UsageError(f"invalid method {method!r}: use one of {', '.join(m.value for m in SpecMethod)}") from None


MAX_TREE_NODES = 256  # a verification forward over the whole tree: engines use up to ~64


def parse_tree(tree) -> tuple[tuple[int, ...], ...]:
    """A candidate tree as JSON text or a list of paths (``[[0],[1],[0,0]]``: each path the top-i
    choice per depth) -> a tuple of paths. Every path's parent must be in the tree too."""
    import json

    if isinstance(tree, str):
        try:
            tree = json.loads(tree)
        except (ValueError, RecursionError):
            raise UsageError(f"invalid --tree {tree[:80]!r}: not JSON (expected e.g. [[0],[1],[0,0]])") from None
    if not isinstance(tree, (list, tuple)) or not tree:
        raise UsageError("invalid --tree: a non-empty list of paths, e.g. [[0],[1],[0,0]]")
    if len(tree) > MAX_TREE_NODES:
        raise UsageError(f"invalid --tree: {len(tree)} nodes, at most {MAX_TREE_NODES}")
    paths = []
    for path in tree:
        if (not isinstance(path, (list, tuple)) or not path
                or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < MAX_TREE_NODES for i in path)):
            raise UsageError(f"invalid --tree node {path!r}: a non-empty list of top-i indices (integers >= 0)")
        paths.append(tuple(path))
    if len(set(paths)) != len(paths):
        raise UsageError("invalid --tree: a path is listed twice")
    known = set(paths)
    for path in paths:
        if len(path) > 1 and path[:-1] not in known:
            raise UsageError(f"invalid --tree node {list(path)}: its parent {list(path[:-1])} is not in the tree")
    return tuple(sorted(paths, key=lambda p: (len(p), p)))


def build_spec_config(method: str, num_speculative_tokens: int | None, prompt_lookup_min: int | None,
                      prompt_lookup_max: int | None, max_batch_size_for_speculation: int | None,
                      has_draft: bool, tree=None, suffix: dict | None = None) -> SpecConfig:
    """The speculative config a registration binds; UsageError naming the option at fault.
    suffix: vLLM's suffix_decoding_* settings without the prefix (method suffix; unset ones take
    vLLM's defaults, recorded)."""
    spec_method = parse_method(method)
    paths = parse_tree(tree) if tree is not None else None
    if paths is not None:
        if spec_method.descriptor.tree == "never":
            raise UsageError(f"--tree applies to methods {' and '.join(tree_methods())}, not {spec_method.value}")
        depth = max(len(path) for path in paths)
        if num_speculative_tokens is not None and num_speculative_tokens != depth:
            raise UsageError(f"num_speculative_tokens {num_speculative_tokens} differs from the tree's depth {depth}")
        num_speculative_tokens = depth
    # a block drafter's head decides k: register reads it, then puts it in place of None or refuses a -k
    k_from_head = num_speculative_tokens is None and spec_method.descriptor.draft_length_from_head
    if k_from_head:
        num_speculative_tokens = 1  # checked below as any k would be
    if num_speculative_tokens is None:
        raise UsageError(f"num_speculative_tokens is missing: pass -k N (or --tree for {' and '.join(tree_methods())})")
    if num_speculative_tokens < 1:
        raise UsageError(f"invalid num_speculative_tokens {num_speculative_tokens}: must be >= 1")
    check_range("num_speculative_tokens", num_speculative_tokens, 1, MAX_SPECULATIVE_TOKENS)
    if max_batch_size_for_speculation is not None and max_batch_size_for_speculation < 1:
        raise UsageError(f"invalid max_batch_size_for_speculation {max_batch_size_for_speculation}: must be >= 1")
    check_range("max_batch_size_for_speculation", max_batch_size_for_speculation, 1, MAX_BATCH_SIZE)
    check_range("prompt_lookup_min", prompt_lookup_min, 1, MAX_PROMPT_LOOKUP)
    check_range("prompt_lookup_max", prompt_lookup_max, 1, MAX_PROMPT_LOOKUP)
    descriptor = spec_method.descriptor
    if not descriptor.prompt_lookup and (prompt_lookup_min is not None or prompt_lookup_max is not None):
        raise UsageError(f"prompt_lookup_min/max apply only to method "
                         f"{' and '.join(m.name for m in METHODS.values() if m.prompt_lookup)}")
    if descriptor.takes_draft:
        if not has_draft:
            what = f"the {spec_method.value} head directory" if descriptor.has_head else "a draft model"
            raise UsageError(f"method {spec_method.value} needs --draft ({what})")
    elif has_draft:
        source = {"target": "with the layers inside the target", "sequence": "from the prompt"}[descriptor.drafts_with]
        raise UsageError(f"method {spec_method.value} drafts {source}: do not pass --draft")
    suffix = {name: value for name, value in (suffix or {}).items() if value is not None}
    if not descriptor.suffix_settings and suffix:
        raise UsageError(f"{', '.join('suffix_decoding_' + name for name in suffix)}: apply only to method "
                         f"{' and '.join(m.name for m in METHODS.values() if m.suffix_settings)}")
    settings = None
    if descriptor.suffix_settings:
        from specreg.core.suffix_settings import SuffixSettings

        settings = SuffixSettings(**suffix)
        if settings.problem():
            raise UsageError(f"invalid {settings.problem()}")
    if descriptor.prompt_lookup:
        prompt_lookup_min = prompt_lookup_min or NGRAM_DEFAULT_LOOKUP[0]
        prompt_lookup_max = prompt_lookup_max or max(prompt_lookup_min, NGRAM_DEFAULT_LOOKUP[1])
        if prompt_lookup_min < 1 or prompt_lookup_max < prompt_lookup_min:
            raise UsageError(
                f"invalid prompt lookup range {prompt_lookup_min}..{prompt_lookup_max}: need 1 <= min <= max")
    return SpecConfig(spec_method, None if k_from_head else num_speculative_tokens, prompt_lookup_min,
                      prompt_lookup_max, max_batch_size_for_speculation, tree=paths, suffix=settings)


def approval_key(key: str | None, what: str) -> str:
    """The private key file a signature is made with: ``key``, else ``$SPECREG_APPROVAL_KEY``.
    UsageError saying that ``what`` (an approval, a rejection, ...) is the user's signature."""
    key = key or os.environ.get("SPECREG_APPROVAL_KEY") or None
    if key is None:
        raise UsageError(f"{what} is your signature: pass --key FILE (or set SPECREG_APPROVAL_KEY); "
                         f"make one with `specreg keys create`")
    return key


def pair_ref(ref: str | PairRef) -> PairRef:
    """``ref`` as a PairRef (parsed when it is text)."""
    return parse_ref(ref) if isinstance(ref, str) else ref

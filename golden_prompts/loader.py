"""Load and check golden prompt sets (format: FORMAT.md, schema: schema.json).

``load_golden_set("default")`` loads a set shipped in this folder; ``load_golden_set(path)``
loads a user's ``.yaml``/``.yml``/``.json``/``.jsonl`` file. Every problem is a one-line
``GoldenSetError`` naming the file, the record (index and id) and the field.

Only pyyaml and jsonschema are imported here: no torch, no transformers. ``GoldenRecord.render``
and ``GoldenRecord.encode`` take an already loaded tokenizer.
"""

from __future__ import annotations

import hashlib
import json
import math
import signal
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator

from specreg.core.documents import MAX_DOCUMENT_BYTES, depth_problem, safe_loader, yaml_problem
from specreg.core.files import read_text_bounded
from specreg.errors import GoldenSetError, ModelReferenceError

SHIPPED_DIR = Path(__file__).parent
SCHEMA_PATH = SHIPPED_DIR / "schema.json"
SUFFIXES = (".yaml", ".yml", ".json", ".jsonl")
# a validation decodes every record twice or more: ten thousand is hours on a CPU already, and the
# schema check of a record costs ~0.3 ms, so a file of a million tiny records is refused, not checked
MAX_RECORDS = 10_000


# A chat template is code from the model folder: its render is bounded in time and size.
RENDER_SECONDS = 5.0
RENDER_MAX_CHARS = 1_000_000


class RenderTimeout(Exception):
    """A chat template ran past RENDER_SECONDS."""


@contextmanager
def time_limit(seconds: float):
    """Raise RenderTimeout in the block after ``seconds`` (SIGALRM: main thread only; elsewhere
    the block runs unbounded, as before)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def expire(_signum, _frame):
        raise RenderTimeout()

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def bound_output(template: str) -> None:
    """Make the render of ``template`` stop past RENDER_MAX_CHARS characters instead of building
    the whole output first: transformers compiles each chat template once (cached) in its own
    sandboxed environment, whose ``concat`` joins the rendered pieces; a bounded join replaces it.
    (One expression that builds a huge string at once, "x" * 10**10, is still Python's allocation.)"""
    if not isinstance(template, str):
        return
    from transformers.utils.chat_template_utils import _compile_jinja_template

    environment = _compile_jinja_template(template).environment
    if getattr(environment, "concat", None) is not bounded_concat:
        environment.concat = bounded_concat


def bounded_concat(pieces) -> str:
    import jinja2

    parts, total = [], 0
    for piece in pieces:
        total += len(piece)
        if total > RENDER_MAX_CHARS:
            raise jinja2.TemplateRuntimeError(f"rendered more than {RENDER_MAX_CHARS} characters")
        parts.append(piece)
    return "".join(parts)


@dataclass(frozen=True)
class Message:
    role: str
    content: str


@dataclass(frozen=True)
class GoldenRecord:
    """One golden prompt: chat ``messages`` or a raw ``prompt`` (exactly one is set)."""

    id: str
    category: str
    max_new_tokens: int
    messages: tuple[Message, ...] | None = None
    prompt: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    tags: tuple[str, ...] = ()

    @property
    def is_chat(self) -> bool:
        return self.messages is not None

    @property
    def is_greedy(self) -> bool:
        """True when the record decodes greedily (no temperature, or temperature 0)."""
        return not self.temperature

    def message_dicts(self) -> list[dict[str, str]]:
        """The messages as the list of {role, content} dicts chat templates expect."""
        return [{"role": m.role, "content": m.content} for m in self.messages or ()]

    def render(self, tokenizer, add_generation_prompt: bool = True) -> str:
        """Text the model sees: the raw prompt, or the messages through the chat template.

        tokenizer: a loaded Hugging Face tokenizer. Raises ModelReferenceError when the record
        has messages and the tokenizer has no chat template.
        """
        if not self.is_chat:
            return self.prompt
        if not tokenizer.chat_template:
            raise ModelReferenceError(
                f"tokenizer {tokenizer.name_or_path!r} has no chat template; golden record "
                f"'{self.id}' uses messages"
            )
        import jinja2

        name = getattr(tokenizer, "name_or_path", "")
        try:
            bound_output(tokenizer.chat_template)
            with time_limit(RENDER_SECONDS):
                text = tokenizer.apply_chat_template(
                    self.message_dicts(), tokenize=False, add_generation_prompt=add_generation_prompt
                )
        except jinja2.TemplateError:
            raise
        except RenderTimeout:
            raise jinja2.TemplateRuntimeError(
                f"chat template of {name} did not render record '{self.id}' within {RENDER_SECONDS:g} s") from None
        except Exception as exc:  # a template is user code: 1/0, range(10**9), a TypeError are its failures
            raise jinja2.TemplateRuntimeError(
                f"chat template of {name} raised {type(exc).__name__} on record '{self.id}': "
                f"{_one_line(str(exc), 160)}") from None
        if not isinstance(text, str) or len(text) > RENDER_MAX_CHARS:
            size = len(text) if isinstance(text, str) else type(text).__name__
            raise jinja2.TemplateRuntimeError(
                f"chat template of {name} rendered record '{self.id}' to {size} characters, over the limit "
                f"of {RENDER_MAX_CHARS}")
        return text

    def encode(self, tokenizer, add_generation_prompt: bool = True) -> list[int]:
        """Prompt token ids as a server would build them.

        A raw prompt is encoded with the tokenizer's own special tokens (e.g. BOS); a rendered
        chat template already holds its special tokens, so none are added (as HF's
        apply_chat_template does).
        """
        text = self.render(tokenizer, add_generation_prompt)
        return list(tokenizer.encode(text, add_special_tokens=not self.is_chat))

    def to_dict(self) -> dict[str, Any]:
        """Canonical dict: only set fields, in schema names (what the content hash covers)."""
        out: dict[str, Any] = {"id": self.id, "category": self.category}
        if self.messages is not None:
            out["messages"] = self.message_dicts()
        else:
            out["prompt"] = self.prompt
        out["max_new_tokens"] = self.max_new_tokens
        for key in ("temperature", "top_p", "top_k", "seed"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.tags:
            out["tags"] = list(self.tags)
        return out


@dataclass(frozen=True)
class GoldenSet:
    """A loaded golden set; ``content_sha256`` hashes name, version and records canonically."""

    name: str
    version: str
    source: Path | None
    content_sha256: str
    records: tuple[GoldenRecord, ...]
    description: str = ""

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self) -> Iterator[GoldenRecord]:
        return iter(self.records)

    @property
    def categories(self) -> tuple[str, ...]:
        """Categories in order of first appearance."""
        return tuple(dict.fromkeys(r.category for r in self.records))

    @property
    def chat_records(self) -> tuple[GoldenRecord, ...]:
        return tuple(r for r in self.records if r.is_chat)

    def by_category(self) -> dict[str, tuple[GoldenRecord, ...]]:
        return {c: tuple(r for r in self.records if r.category == c) for c in self.categories}

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "records": [r.to_dict() for r in self.records],
        }


def content_sha256(name: str, version: str, records: tuple[GoldenRecord, ...]) -> str:
    """SHA-256 of the canonical JSON (sorted keys, no spaces, UTF-8) of name, version, records.

    Key order, YAML vs JSONL, comments, ``description`` and absent-vs-empty ``tags`` do not
    change it; any change to a record (text, order, sampling) does.
    """
    canonical = {"name": name, "version": version, "records": [r.to_dict() for r in records]}
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def shipped_set_names() -> list[str]:
    """Names of the sets shipped with specreg (file stems in this folder)."""
    return sorted(p.stem for p in SHIPPED_DIR.iterdir() if p.suffix in (".yaml", ".jsonl"))


def load_golden_set(name_or_path: str | Path) -> GoldenSet:
    """Load a shipped set by name ("default", "smoke") or a golden file by path.

    Returns a GoldenSet; raises GoldenSetError (one line: file, record, field) on any problem.
    """
    path = Path(name_or_path)
    text = str(name_or_path)
    # A bare name is a shipped set, never a file of that name in the working directory (which
    # would shadow it); a file is named by a path: with a folder or a golden file suffix.
    if "/" not in text and "\\" not in text and path.suffix not in SUFFIXES:
        for suffix in (".yaml", ".jsonl"):
            shipped = SHIPPED_DIR / f"{text}{suffix}"
            if shipped.is_file():
                return load_golden_file(shipped)
        raise GoldenSetError(
            f"unknown golden set '{text}': shipped sets are {', '.join(shipped_set_names())}; "
            "or pass the path of a .yaml or .jsonl file"
        )
    if path.exists():  # a folder, a device or a FIFO is refused by the read, naming what it is
        return load_golden_file(path)
    raise GoldenSetError(f"{path}: golden set file not found")


def load_golden_file(path: str | Path) -> GoldenSet:
    """Parse, schema-check and build a GoldenSet from one file (format chosen by suffix)."""
    path = Path(path)
    if path.suffix not in SUFFIXES:
        raise GoldenSetError(
            f"{path}: unknown golden set format '{path.suffix}' (use .yaml, .yml, .json or .jsonl)"
        )
    text = read_text_bounded(path, MAX_DOCUMENT_BYTES, "golden set", GoldenSetError)
    record_lines = None
    if path.suffix == ".jsonl":
        document, record_lines = _parse_jsonl(text, path)
    elif path.suffix == ".json":
        document = _parse_json(text, path)
    else:
        document = _parse_yaml(text, path)
    return golden_set_from_document(document, source=path, record_lines=record_lines)


def golden_set_from_document(document: Any, source: Path | None = None,
                             record_lines: list[int] | None = None) -> GoldenSet:
    """Check a parsed document ({name, version, records}) and build the GoldenSet.

    record_lines: the 1-based line of each record (JSONL), named in error messages.
    """
    where = str(source) if source is not None else "<golden set>"
    if not isinstance(document, dict):
        raise GoldenSetError(
            f"{where}: expected a mapping with 'name', 'version' and 'records', "
            f"got {_type_name(document)}"
        )
    records_in = document.get("records")
    if isinstance(records_in, list) and len(records_in) > MAX_RECORDS:
        raise GoldenSetError(f"{where}: {len(records_in)} records, over the limit of {MAX_RECORDS} for a golden set")
    _refuse_non_finite(document, where, record_lines)
    errors = sorted(_validator().iter_errors(document), key=_error_sort_key)
    if errors:
        message = _describe_schema_error(errors[0], document, where, record_lines)
        if len(errors) > 1:
            message += f" (and {len(errors) - 1} more error{'s' if len(errors) > 2 else ''})"
        raise GoldenSetError(message)

    records = []
    first_index: dict[str, int] = {}
    for index, raw in enumerate(document["records"]):
        prefix = _record_prefix(where, index, raw, record_lines)
        if raw["id"] in first_index:
            raise GoldenSetError(
                f"{prefix} field 'id': duplicate id, first used by records[{first_index[raw['id']]}]"
            )
        first_index[raw["id"]] = index
        messages = raw.get("messages")
        if messages is not None and messages[-1]["role"] == "assistant":
            raise GoldenSetError(
                f"{prefix} field 'messages[{len(messages) - 1}].role': the last message must be "
                "from 'user' or 'system' (the model writes the answer), got 'assistant'"
            )
        records.append(_build_record(raw))

    name = document["name"]
    version = str(document["version"])
    records = tuple(records)
    return GoldenSet(
        name=name,
        version=version,
        source=source,
        content_sha256=content_sha256(name, version, records),
        records=records,
        description=document.get("description", ""),
    )


def _refuse_non_finite(document: dict, where: str, record_lines: list[int] | None) -> None:
    """NaN passes every JSON-schema bound (each comparison with it is false) and YAML's .nan and
    JSON's NaN both parse: a sampling setting must be a finite number."""
    records = document.get("records")
    for index, raw in enumerate(records if isinstance(records, list) else ()):
        if not isinstance(raw, dict):
            continue
        for key in ("temperature", "top_p", "max_new_tokens", "top_k", "seed"):
            value = raw.get(key)
            if isinstance(value, float) and not math.isfinite(value):
                prefix = _record_prefix(where, index, raw, record_lines)
                raise GoldenSetError(f"{prefix} field '{key}': {value!r} is not a finite number")


def check_vocabulary(golden: "GoldenSet", vocab_size: int | None, model: str = "the target") -> None:
    """GoldenSetError (file, record, field) for a ``top_k`` over ``vocab_size`` (None: unknown,
    nothing to check): the sampler keeps every token then, so the record would not sample what
    it says."""
    if not vocab_size:
        return
    where = str(golden.source) if golden.source is not None else golden.name
    for index, record in enumerate(golden.records):
        if record.top_k is not None and record.top_k > vocab_size:
            raise GoldenSetError(f"{where}: records[{index}] (id '{record.id}') field 'top_k': {record.top_k} is over "
                                 f"the vocabulary of {model} ({vocab_size} tokens)")


def _build_record(raw: dict) -> GoldenRecord:
    messages = raw.get("messages")
    temperature = raw.get("temperature")
    top_p = raw.get("top_p")
    return GoldenRecord(
        id=raw["id"],
        category=raw["category"],
        max_new_tokens=raw["max_new_tokens"],
        messages=None if messages is None else tuple(Message(m["role"], m["content"]) for m in messages),
        prompt=raw.get("prompt"),
        # 1 and 1.0 are the same setting; keep floats so that the canonical JSON agrees.
        temperature=None if temperature is None else float(temperature),
        top_p=None if top_p is None else float(top_p),
        top_k=raw.get("top_k"),
        seed=raw.get("seed"),
        tags=tuple(raw.get("tags", ())),
    )


# --- parsing ----------------------------------------------------------------------------


def _parse_yaml(text: str, path: Path) -> Any:
    import yaml

    class UniqueKeyLoader(safe_loader()):
        pass

    def construct_mapping(loader, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = loader.construct_object(key_node, deep=deep)
            if key in seen:
                # yaml keeps the last value silently; a golden file with two `prompt:` keys is a mistake.
                raise GoldenSetError(
                    f"{path}: duplicate key '{key}' at line {key_node.start_mark.line + 1}"
                )
            seen.add(key)
        return loader.construct_mapping(node, deep=deep)

    UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    try:
        # before anything is built: aliases could expand to gigabytes, and each mapping built costs
        # ~50 times its scan (a record of a dozen chat turns with tags is 15 of them)
        problem = yaml_problem(text, max_containers=16 * MAX_RECORDS)
        if problem:
            raise GoldenSetError(f"{path}: {problem}")
        document = yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)
    except ValueError as exc:  # an integer over Python's 4300 digits, from YAML's int constructor
        raise GoldenSetError(f"{path}: invalid YAML: {_one_line(str(exc), 120)}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise GoldenSetError(f"{path}: invalid YAML{at}: {problem}") from None
    if document is None:
        raise GoldenSetError(f"{path}: empty golden set file")
    return document


def _parse_json(text: str, path: Path) -> Any:
    if not text.strip():
        raise GoldenSetError(f"{path}: empty golden set file")
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise GoldenSetError(
            f"{path}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}"
        ) from None
    except (RecursionError, ValueError) as exc:  # deep nesting; integers over 4300 digits
        raise GoldenSetError(f"{path}: invalid JSON: {_one_line(str(exc) or 'nested too deeply', 120)}") from None
    problem = depth_problem(document)
    if problem:
        raise GoldenSetError(f"{path}: {problem}")
    return document


def _parse_jsonl(text: str, path: Path) -> tuple[dict, list[int]]:
    """JSONL: the first non-blank line is the header {name, version, ...}, each next one a record."""
    header = None
    records: list[Any] = []
    lines: list[int] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise GoldenSetError(f"{path}: line {number}: invalid JSON at column {exc.colno}: {exc.msg}") from None
        except (RecursionError, ValueError) as exc:  # deep nesting; integers over 4300 digits
            raise GoldenSetError(f"{path}: line {number}: invalid JSON: "
                                 f"{_one_line(str(exc) or 'nested too deeply', 120)}") from None
        problem = depth_problem(value)
        if problem:
            raise GoldenSetError(f"{path}: line {number}: {problem}")
        if header is None:
            if not isinstance(value, dict) or "id" in value or "records" in value:
                raise GoldenSetError(
                    f"{path}: line {number}: the first line must be the set header "
                    '{"name": ..., "version": ...}'
                )
            header = value
        else:
            records.append(value)
            lines.append(number)
    if header is None:
        raise GoldenSetError(f"{path}: empty golden set file")
    return {**header, "records": records}, lines


# --- schema errors as one line ----------------------------------------------------------


@lru_cache(maxsize=1)
def _validator():
    import jsonschema

    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def _error_sort_key(error) -> tuple:
    # Document order: records[2] before records[10]; at one place, a missing field first.
    path = tuple((0, p, "") if isinstance(p, int) else (1, 0, p) for p in error.absolute_path)
    return (path, error.validator != "required")


def _record_prefix(where: str, index: int, raw: Any, record_lines: list[int] | None) -> str:
    line = f" line {record_lines[index]}," if record_lines else ""
    record_id = raw.get("id") if isinstance(raw, dict) else None
    named = f" (id '{record_id}')" if isinstance(record_id, str) else ""
    return f"{where}:{line} records[{index}]{named}"


def _describe_schema_error(error, document: dict, where: str, record_lines: list[int] | None) -> str:
    path = list(error.absolute_path)
    if len(path) >= 2 and path[0] == "records" and isinstance(path[1], int):
        prefix = _record_prefix(where, path[1], document["records"][path[1]], record_lines)
        field_path = path[2:]
    else:
        prefix = f"{where}:"
        field_path = path
    field = _field_name(field_path)

    if error.validator == "required":
        missing = [k for k in error.validator_value if k not in error.instance]
        target = _field_name(field_path + [missing[0]])
        return f"{prefix} field '{target}': missing"
    if error.validator == "additionalProperties":
        allowed = set(error.schema.get("properties", {}))
        unknown = sorted(str(k) for k in error.instance if k not in allowed)
        target = _field_name(field_path + [unknown[0]])
        return f"{prefix} field '{target}': unknown field (allowed: {', '.join(sorted(allowed))})"
    if error.validator == "oneOf":
        has = [k for k in ("messages", "prompt") if k in error.instance]
        got = "has both" if len(has) == 2 else "has neither"
        return f"{prefix}: needs exactly one of 'messages' (chat) or 'prompt' (raw text), {got}"
    located = f"{prefix} field '{field}'" if field else prefix
    if error.validator == "type":
        expected = error.validator_value
        expected = " or ".join(expected) if isinstance(expected, list) else expected
        return f"{located}: expected {expected}, got {_type_name(error.instance)} {_short(error.instance)}"
    if error.validator == "pattern":
        return f"{located}: {_short(error.instance)} does not match {error.validator_value}"
    if error.validator == "enum":
        allowed = ", ".join(repr(v) for v in error.validator_value)
        return f"{located}: {_short(error.instance)} is not one of {allowed}"
    return f"{located}: {_one_line(error.message, 160)}"


def _field_name(path: list) -> str:
    name = ""
    for part in path:
        name += f"[{part}]" if isinstance(part, int) else (f".{part}" if name else str(part))
    return name


def _type_name(value: Any) -> str:
    return {dict: "mapping", list: "list", str: "string", bool: "boolean", int: "integer",
            float: "number", type(None): "null"}.get(type(value), type(value).__name__)


def _short(value: Any, limit: int = 60) -> str:
    return _one_line(repr(value), limit)


def _one_line(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."

"""Load and check golden prompt sets (format: FORMAT.md, schema: schema.json).

``load_golden_set("default")`` loads a set shipped in this folder; ``load_golden_set(path)``
loads a user's ``.yaml``/``.yml``/``.json``/``.jsonl`` file. It is the one place where a name is
told from a path: a command calls it once, where it starts, and passes the loaded set (or its
``reference``: name, source, content hash) down. Every problem is a one-line ``GoldenSetError``
naming the file, the record (index and id) and the field.

Only pyyaml and jsonschema are imported here: no torch, no transformers. The loaded set and its
records are records.py's (``GoldenRecord.render`` and ``.encode`` take an already loaded
tokenizer); a chat template renders in template_sandbox.py.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from specreg.core.documents import MAX_DOCUMENT_BYTES, depth_problem, one_line, safe_loader, yaml_problem
from specreg.core.files import read_text_bounded
from specreg.errors import GoldenSetError
from specreg.golden_prompts.records import GoldenRecord, GoldenSet, Message, content_sha256

SHIPPED_DIR = Path(__file__).parent
SCHEMA_PATH = SHIPPED_DIR / "schema.json"
SUFFIXES = (".yaml", ".yml", ".json", ".jsonl")
# a validation decodes every record twice or more: ten thousand is hours on a CPU already, and the
# schema check of a record costs ~0.3 ms, so a file of a million tiny records is refused, not checked
MAX_RECORDS = 10_000


def shipped_set_names() -> list[str]:
    """Names of the sets shipped with specreg (file stems in this folder)."""
    return sorted(p.stem for p in SHIPPED_DIR.iterdir() if p.suffix in (".yaml", ".jsonl"))


def load_golden_set(name_or_path: str | Path) -> GoldenSet:
    """Load a shipped set by name ("default", "smoke") or a golden file by path.

    Returns a GoldenSet (``shipped`` set for a shipped one); raises GoldenSetError (one line:
    file, record, field) on any problem.
    """
    path = Path(name_or_path)
    text = str(name_or_path)
    # A bare name is a shipped set, never a file of that name in the working directory (which
    # would shadow it); a file is named by a path: with a folder or a golden file suffix.
    if "/" not in text and "\\" not in text and path.suffix not in SUFFIXES:
        for suffix in (".yaml", ".jsonl"):
            shipped = SHIPPED_DIR / f"{text}{suffix}"
            if shipped.is_file():
                return replace(load_golden_file(shipped), shipped=True)
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
        raise GoldenSetError(f"{path}: invalid YAML: {one_line(str(exc), 120)}") from None
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
        raise GoldenSetError(f"{path}: invalid JSON: {one_line(str(exc) or 'nested too deeply', 120)}") from None
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
                                 f"{one_line(str(exc) or 'nested too deeply', 120)}") from None
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
    return f"{located}: {one_line(error.message, 160)}"


def _field_name(path: list) -> str:
    name = ""
    for part in path:
        name += f"[{part}]" if isinstance(part, int) else (f".{part}" if name else str(part))
    return name


def _type_name(value: Any) -> str:
    return {dict: "mapping", list: "list", str: "string", bool: "boolean", int: "integer",
            float: "number", type(None): "null"}.get(type(value), type(value).__name__)


def _short(value: Any, limit: int = 60) -> str:
    return one_line(repr(value), limit)

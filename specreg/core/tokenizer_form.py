"""The tokenizer's canonical form: what defines tokenization (vocab, merges, added and special
tokens, the normalizer / pre-tokenizer / post-processor / decoder settings), independent of file
formatting, so that re-saving or re-indenting changes nothing; its length; the chat template.
Nothing here imports tokenizers or transformers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specreg.errors import ModelReferenceError
from specreg.core.digests import sha256_file, sha256_hex
from specreg.core.files import MAX_JSON_BYTES, read_bounded, read_json_file, read_text_bounded


# tokenizer.json parsed and checked, by the sha256 of its bytes: one validate reads each model's
# file in both fingerprints of the integrity check and in the check of every tokenizer load
# (metadata_changes), a few MB of JSON parsed and walked each time. The bytes are read and hashed
# on every call, so a changed file is parsed and checked anew; a few entries at most are kept.
PARSED_TOKENIZER_JSON: dict[str, dict[str, Any]] = {}
PARSED_TOKENIZER_JSON_ENTRIES = 4


def read_tokenizer_json(path: Path) -> dict[str, Any]:
    """tokenizer.json, with the fields the fingerprint reads checked for type: ``model`` an
    object whose ``merges`` are strings or string pairs and whose ``vocab`` maps tokens to
    integer ids (or lists [token, score]), ``added_tokens`` objects with an integer ``id``.

    The object returned is shared by every call that reads the same bytes: read it, never
    modify it."""
    try:
        raw = read_bounded(path, MAX_JSON_BYTES, "", ModelReferenceError)
    except OSError as exc:
        raise ModelReferenceError(f"{path}: cannot read: {exc.strerror or exc}") from None
    digest = sha256_hex(raw)
    if digest in PARSED_TOKENIZER_JSON:
        return PARSED_TOKENIZER_JSON[digest]
    data = check_tokenizer_json(read_json_file(path, data=raw), path)
    while len(PARSED_TOKENIZER_JSON) >= PARSED_TOKENIZER_JSON_ENTRIES:
        del PARSED_TOKENIZER_JSON[next(iter(PARSED_TOKENIZER_JSON))]
    PARSED_TOKENIZER_JSON[digest] = data
    return data


def check_tokenizer_json(data: dict[str, Any], path: Path) -> dict[str, Any]:
    """read_tokenizer_json's checks of the parsed file -> the same object; ModelReferenceError
    naming the file and field otherwise."""
    model = data.get("model")
    if model is not None and not isinstance(model, dict):
        raise ModelReferenceError(f"{path}: field 'model' must be an object, got {type(model).__name__}")
    model = model or {}
    merges = model.get("merges")
    if merges is not None and not (isinstance(merges, list) and all(
            isinstance(m, str) or (isinstance(m, list) and all(isinstance(part, str) for part in m)) for m in merges)):
        raise ModelReferenceError(f"{path}: field 'model.merges' must be a list of strings or string pairs")
    vocab = model.get("vocab")
    if isinstance(vocab, dict):
        bad = next((token for token, token_id in vocab.items() if type(token_id) is not int or token_id < 0), None)
        if bad is not None:
            raise ModelReferenceError(f"{path}: field 'model.vocab': token {bad[:40]!r} has id {vocab[bad]!r}, "
                                      "not a non-negative integer")
    elif vocab is not None and not isinstance(vocab, list):
        raise ModelReferenceError(f"{path}: field 'model.vocab' must be an object or a list")
    added = data.get("added_tokens")
    if added is not None and not (isinstance(added, list) and all(
            isinstance(t, dict) and type(t.get("id", 0)) is int and t.get("id", 0) >= 0 for t in added)):
        raise ModelReferenceError(f"{path}: field 'added_tokens' must be a list of objects with a "
                                  "non-negative integer 'id'")
    return data


def canonical_tokenizer(directory: Path) -> dict[str, Any] | None:
    """What defines tokenization, independent of file formatting; None when there is none."""
    form: dict[str, Any] = {}
    tokenizer_json = directory / "tokenizer.json"
    if tokenizer_json.is_file():
        data = read_tokenizer_json(tokenizer_json)
        model = dict(data.get("model") or {})
        merges = model.pop("merges", None) or []
        # merges are written as "a b" (old) or ["a", "b"] (new): one form for both
        model["merges"] = [m if isinstance(m, str) else " ".join(m) for m in merges]
        if isinstance(model.get("vocab"), dict):
            model["vocab"] = sorted(model["vocab"].items(), key=lambda item: (item[1], item[0]))
        form["model"] = model
        form["added_tokens"] = sorted(data.get("added_tokens") or [], key=lambda t: t.get("id", 0))
        for part in ("normalizer", "pre_tokenizer", "post_processor", "decoder"):
            form[part] = data.get(part)
    for name in ("vocab.json", "merges.txt", "tokenizer.model"):
        path = directory / name
        if path.is_file() and "model" not in form:
            form[name] = sha256_file(path)
    if not form:
        return None
    config_path = directory / "tokenizer_config.json"
    config = read_json_file(config_path) if config_path.is_file() else {}
    special_map_path = directory / "special_tokens_map.json"
    special_map = read_json_file(special_map_path) if special_map_path.is_file() else {}
    special: dict[str, Any] = {}
    for key in ("bos_token", "eos_token", "pad_token", "unk_token", "cls_token", "sep_token", "mask_token"):
        value = config.get(key, special_map.get(key))
        special[key] = value.get("content") if isinstance(value, dict) else value
    form["special_tokens"] = special
    form["added_tokens_decoder"] = config.get("added_tokens_decoder")
    for key in ("add_bos_token", "add_eos_token", "clean_up_tokenization_spaces", "model_max_length_is_set"):
        if key in config:
            form[key] = config[key]
    return form


def tokenizer_length(directory: Path) -> int | None:
    """Number of ids the tokenizer can produce (max id + 1), read from tokenizer.json."""
    path = directory / "tokenizer.json"
    if not path.is_file():
        return None
    data = read_tokenizer_json(path)
    vocab = (data.get("model") or {}).get("vocab")
    ids = list(vocab.values()) if isinstance(vocab, dict) else []
    ids += [token.get("id", -1) for token in data.get("added_tokens") or []]
    return max(ids) + 1 if ids else None


def read_chat_template(directory: Path) -> str | None:
    """The chat template string, wherever this transformers generation saved it."""
    jinja = directory / "chat_template.jinja"
    if jinja.is_file():
        return read_text_bounded(jinja, MAX_JSON_BYTES, "", ModelReferenceError)
    as_json = directory / "chat_template.json"
    if as_json.is_file():
        template = read_json_file(as_json).get("chat_template")
        if template:
            return template if isinstance(template, str) else json.dumps(template, sort_keys=True)
    config_path = directory / "tokenizer_config.json"
    if config_path.is_file():
        template = read_json_file(config_path).get("chat_template")
        if isinstance(template, list):  # named templates: [{"name":..., "template":...}]
            return json.dumps(template, sort_keys=True)
        if template is not None and not isinstance(template, str):
            raise ModelReferenceError(f"{config_path}: field 'chat_template' must be a string or a list of "
                                      f"named templates, got {type(template).__name__}")
        return template
    return None

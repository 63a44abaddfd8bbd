"""Tokenizer alignment between a draft and a target model directory (a static check).

Speculative decoding hands token ids from the draft to the target, so both must mean the same
text by the same id. vLLM and HF compare only ``vocab_size``; a swapped id or an extra special
token passes there and silently lowers acceptance (or corrupts sampling). Here we compare:

- the token -> id map, BPE merges and the model settings of tokenizer.json;
- added tokens (content, id, special flag, stripping) and bos/eos/pad/unk strings and ids;
- normalizer, pre-tokenizer, post-processor and decoder;
- encoding settings in tokenizer_config.json (warn: their effect is checked on real prompts);
- embedding sizes (config.json vocab_size): extra rows beyond the tokenizer are padding -> warn;
- every golden prompt encoded by both sides, showing the first differing token.

The draft's files are read the way a serving engine uses them: engines tokenize with the
target's tokenizer and feed the draft those ids (vLLM's draft ModelConfig takes the target's
tokenizer), so the draft's tokenizer files are loaded with the target's tokenizer class. What
transformers' AutoTokenizer builds for the draft on its own (in transformers 5 it may pick the
class from config.json's model_type, e.g. a Qwen2Tokenizer that adds '<|endoftext|>') is
compared too and a difference is a warning: only a peer that loads the draft's tokenizer
itself (HF assisted generation) would see it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specreg.errors import ModelReferenceError
from specreg.runtime.loading import load_tokenizer
from specreg.runtime.pair import BEYOND_TARGET_RULE, PREFIX_REFUSAL, vocabulary_relation
from specreg.core.differences import first_difference, first_json_difference, first_token_difference, token_label
from specreg.core.types import FAIL, WARN, CheckResult, summarize_findings
from specreg.validators.context import Check, CheckContext

CHECK_NAME = "tokenizer"
TOKENIZER_JSON_PARTS = ("normalizer", "pre_tokenizer", "post_processor", "decoder")
# tokenizer_config.json keys that change how text becomes ids (or ids become text).
ENCODING_SETTINGS = ("add_bos_token", "add_eos_token", "add_prefix_space", "do_lower_case",
                     "legacy", "clean_up_tokenization_spaces", "split_special_tokens")
SPECIAL_TOKEN_ROLES = ("bos", "eos", "pad", "unk")
MAX_EXAMPLES = 10


def check_tokenizer_alignment(draft_dir: str | Path, target_dir: str | Path, golden=None, *,
                              draft_tokenizer=None, target_tokenizer=None,
                              draft_own_tokenizer=None) -> CheckResult:
    """Compare the tokenizers of two model directories.

    draft_dir, target_dir: local model folders (tokenizer files, config.json).
    golden: an optional GoldenSet whose every record is encoded by both sides.
    draft_tokenizer, target_tokenizer: already loaded tokenizers (loaded from the dirs if None);
    draft_own_tokenizer: the draft's as AutoTokenizer builds it alone (load_pair_tokenizers; loaded
    from draft_dir if None), compared with draft_tokenizer for the loader warning.
    Returns a CheckResult "tokenizer": fail on any difference in meaning, warn on padded
    embeddings or differing encoding settings whose effect the golden prompts did not show.
    """
    draft_dir, target_dir = Path(draft_dir), Path(target_dir)
    target = target_tokenizer if target_tokenizer is not None else load_tokenizer(target_dir)
    draft = draft_tokenizer if draft_tokenizer is not None else load_tokenizer(draft_dir, tokenizer_class=type(target))
    findings, notes, relation = _compare_definitions(draft_dir, target_dir, draft, target, draft_own_tokenizer)
    figures: dict[str, float] = {
        "draft_tokenizer_length": len(draft),
        "target_tokenizer_length": len(target),
    }
    embedding_findings, vocab_figures = _compare_embedding_sizes(draft_dir, target_dir, len(draft), len(target),
                                                                 relation)
    findings += embedding_findings
    figures.update(vocab_figures)
    if not vocab_figures:
        notes.append("config.json vocab_size missing on one side: embedding sizes not compared")

    golden_evidence = None
    if golden is not None:
        golden_finding, golden_evidence = _compare_golden_encodings(draft, target, golden)
        findings += golden_finding
        figures["golden_prompts_compared"] = golden_evidence["compared"]
        figures["golden_prompts_mismatched"] = len(golden_evidence["mismatches"])
        figures["golden_prompts_skipped"] = len(golden_evidence["skipped"])

    figures["vocab_id_mismatches"] = sum(f.get("count", 0) for f in findings if f["aspect"] == "vocab")
    ok = f"tokenizers match ({len(target)} tokens)"
    if golden_evidence is not None:
        ok += f"; {golden_evidence['compared']} golden prompts of '{golden.name}' encode identically"
    status, summary = summarize_findings(findings, ok)
    evidence: dict[str, Any] = {"findings": findings, "notes": notes}
    if golden_evidence is not None:
        evidence["golden"] = golden_evidence
    return CheckResult(CHECK_NAME, status, summary, evidence, figures)


def _compare_definitions(draft_dir: Path, target_dir: Path, draft, target,
                         draft_own=None) -> tuple[list[dict], list[str], str | None]:
    """What the two tokenizers are (loaders, vocabulary, tokenizer.json, special tokens, encoding
    settings) -> (findings, notes on what could not be compared, the vocabulary relation)."""
    findings: list[dict] = []
    notes: list[str] = []
    findings += _compare_loaders(draft_dir, draft, draft_own)

    draft_vocab, target_vocab = draft.get_vocab(), target.get_vocab()
    relation = vocabulary_relation(draft_vocab, target_vocab)
    findings += _compare_vocab(draft_vocab, target_vocab, relation)
    # draft-only tokens past the target's vocabulary: one warning (the vocab finding), whatever
    # else lists them (added or special tokens)
    beyond = len(target_vocab) if relation == "extends" else None

    draft_json, target_json = _tokenizer_json(draft_dir, draft), _tokenizer_json(target_dir, target)
    if draft_json is None or target_json is None:
        notes.append("no tokenizer.json on one side: merges, added-token flags, normalizer, "
                     "pre-tokenizer, post-processor and decoder not compared")
    else:
        findings += _compare_tokenizer_json(draft_json, target_json, beyond)

    findings += _compare_special_tokens(draft, target, beyond)
    findings += _compare_encoding_settings(draft_dir, target_dir)
    return findings, notes, relation


def load_pair_tokenizers(draft_dir: str | Path, target_dir: str | Path, *, draft_expected=None,
                         target_expected=None) -> dict[str, Any]:
    """Both tokenizers as an engine uses them: the target's, and the draft's files read with
    the target's tokenizer class -> {"draft_tokenizer", "target_tokenizer"} (the keyword
    arguments of the tokenizer and chat-template checks), with "draft_own_tokenizer", the draft's
    as AutoTokenizer builds it alone (the tokenizer check's loader comparison), when it builds.
    *_expected: the registered fingerprints, checked while the files are read
    (runtime.loading.load_tokenizer). Inside loading.shared_tokenizers (a validation), where
    AutoTokenizer picks the target's class for the draft too (the usual case), the draft's own build
    is also its reading with that class: two builds, not three."""
    target = load_tokenizer(target_dir, expected=target_expected)
    loaded = {"target_tokenizer": target}
    try:
        loaded["draft_own_tokenizer"] = load_tokenizer(draft_dir, expected=draft_expected)
    except ModelReferenceError:  # the loader comparison says why; the engine's class may still read the files
        pass
    loaded["draft_tokenizer"] = load_tokenizer(draft_dir, expected=draft_expected, tokenizer_class=type(target))
    return loaded


# --- the comparisons ------------------------------------------------------------------


def _compare_loaders(draft_dir: Path, draft, own=None) -> list[dict]:
    """A warning when AutoTokenizer, left to itself, builds the draft's tokenizer differently
    (``own``; built here when None) from its files read as the engine reads them (``draft``):
    another class, extra tokens, other special tokens."""
    try:
        own = own if own is not None else load_tokenizer(draft_dir)
    except ModelReferenceError as exc:
        return [{"aspect": "loader", "status": WARN,
                 "message": f"transformers cannot load the draft's tokenizer on its own ({exc}); engines use the "
                            "target's tokenizer, so this matters only to peers that load the draft's"}]
    if type(own) is type(draft):
        return []
    differences = []
    ours, engine = own.get_vocab(), draft.get_vocab()
    extra = sorted((t for t in ours if t not in engine), key=ours.get)
    if extra:
        differences.append("adds " + ", ".join(f"{t!r} (id {ours[t]})" for t in extra[:3])
                           + (f" and {len(extra) - 3} more" if len(extra) > 3 else ""))
    moved = [t for t in engine if t in ours and ours[t] != engine[t]]
    if moved or len(extra) < len(ours) - len(engine):
        differences.append(f"maps {len(moved) or 'some'} token(s) to other ids")
    for role in SPECIAL_TOKEN_ROLES:
        mine, theirs = getattr(own, f"{role}_token", None), getattr(draft, f"{role}_token", None)
        if mine != theirs:
            differences.append(f"sets {role} token {mine!r} (files: {theirs!r})")
    if not differences:
        return []
    model_type = (_read_json(draft_dir / "config.json") or {}).get("model_type")
    return [{"aspect": "loader", "status": WARN, "loader_class": type(own).__name__,
             "engine_class": type(draft).__name__,
             "message": f"transformers builds a {type(own).__name__} for the draft (from its model_type "
                        f"{model_type!r}) that {'; '.join(differences)}; engines feed the draft the target's "
                        f"token ids ({type(draft).__name__} over the same files), so only a peer loading the "
                        "draft's own tokenizer (HF assisted generation) would see this"}]


def _compare_vocab(draft_vocab: dict[str, int], target_vocab: dict[str, int], relation: str | None) -> list[dict]:
    if relation == "extends":
        added = sorted((t for t in draft_vocab if t not in target_vocab), key=draft_vocab.get)
        shown = ", ".join(f"{t!r} (id {draft_vocab[t]})" for t in added[:3])
        return [{"aspect": "vocab", "status": WARN, "count": 0, "beyond_target": len(added),
                 "message": f"the draft's tokenizer adds {len(added)} token(s) after the target's vocabulary "
                            f"({shown}{' ...' if len(added) > 3 else ''}), the ids below the same: "
                            + BEYOND_TARGET_RULE.format(n=len(target_vocab))}]
    if relation == "prefix":
        return [{"aspect": "vocab", "status": FAIL, "count": len(target_vocab) - len(draft_vocab),
                 "message": PREFIX_REFUSAL.format(draft=len(draft_vocab), target=len(target_vocab))}]
    findings = []
    moved = sorted((t for t in draft_vocab if t in target_vocab and draft_vocab[t] != target_vocab[t]),
                   key=draft_vocab.get)
    if moved:
        shown = "; ".join(f"{t!r} is {draft_vocab[t]} in draft, {target_vocab[t]} in target" for t in moved[:3])
        more = f" (and {len(moved) - 3} more)" if len(moved) > 3 else ""
        findings.append({
            "aspect": "vocab", "status": FAIL, "count": len(moved),
            "message": f"token ids differ: {shown}{more}",
            "examples": [{"token": t, "draft_id": draft_vocab[t], "target_id": target_vocab[t]}
                         for t in moved[:MAX_EXAMPLES]],
        })
    for side, ours, theirs in (("draft", draft_vocab, target_vocab), ("target", target_vocab, draft_vocab)):
        only = sorted((t for t in ours if t not in theirs), key=ours.get)
        if only:
            shown = ", ".join(f"{t!r} (id {ours[t]})" for t in only[:3])
            more = f" (and {len(only) - 3} more)" if len(only) > 3 else ""
            findings.append({
                "aspect": "vocab", "status": FAIL, "count": len(only),
                "message": f"tokens only in {side}'s vocabulary: {shown}{more}",
                "examples": [{"token": t, f"{side}_id": ours[t]} for t in only[:MAX_EXAMPLES]],
            })
    return findings


def _compare_tokenizer_json(draft: dict, target: dict, beyond: int | None = None) -> list[dict]:
    findings = []
    draft_model, target_model = draft.get("model") or {}, target.get("model") or {}

    draft_merges = [_merge_text(m) for m in draft_model.get("merges") or []]
    target_merges = [_merge_text(m) for m in target_model.get("merges") or []]
    if draft_merges != target_merges:
        index = first_difference(draft_merges, target_merges)
        findings.append({
            "aspect": "merges", "status": FAIL, "index": index,
            "message": f"BPE merges differ at merge {index}: draft {_at(draft_merges, index)!r}, "
                       f"target {_at(target_merges, index)!r} ({len(draft_merges)} vs "
                       f"{len(target_merges)} merges)",
        })

    # Model settings (type, unk_token, byte_fallback, ...): the vocab and merges are done above.
    draft_settings = {k: v for k, v in draft_model.items() if k not in ("vocab", "merges")}
    target_settings = {k: v for k, v in target_model.items() if k not in ("vocab", "merges")}
    difference = first_json_difference(draft_settings, target_settings)
    if difference is not None:
        findings.append(_part_finding("model", difference))

    findings += _compare_added_tokens(draft.get("added_tokens") or [], target.get("added_tokens") or [], beyond)

    for part in TOKENIZER_JSON_PARTS:
        difference = first_json_difference(draft.get(part), target.get(part))
        if difference is not None:
            findings.append(_part_finding(part, difference))
    return findings


def _compare_added_tokens(draft: list[dict], target: list[dict], beyond: int | None = None) -> list[dict]:
    """``beyond``: the target's vocabulary size when the draft's tokens past it are covered by the
    vocab finding (BEYOND_TARGET_RULE); such draft-only tokens are not findings again here."""
    findings = []
    draft_by_content = {t["content"]: t for t in draft}
    target_by_content = {t["content"]: t for t in target}
    for side, ours, theirs in (("draft", draft_by_content, target_by_content),
                               ("target", target_by_content, draft_by_content)):
        for content, token in ours.items():
            if content not in theirs:
                if side == "draft" and beyond is not None and isinstance(token.get("id"), int) \
                        and token["id"] >= beyond:
                    continue
                kind = "special" if token.get("special") else "not special"
                findings.append({
                    "aspect": "added_tokens", "status": FAIL, "token": content, "side": side,
                    "message": f"added token {content!r} (id {token.get('id')}, {kind}) only in {side}",
                })
    for content, token in draft_by_content.items():
        other = target_by_content.get(content)
        if other is None:
            continue
        difference = first_json_difference(token, other)
        if difference is not None:
            key, draft_value, target_value = difference
            findings.append({
                "aspect": "added_tokens", "status": FAIL, "token": content,
                "message": f"added token {content!r} differs in {key}: draft {draft_value!r}, "
                           f"target {target_value!r}",
            })
    return findings


def _compare_special_tokens(draft, target, beyond: int | None = None) -> list[dict]:
    findings = []
    for role in SPECIAL_TOKEN_ROLES:
        draft_pair = (getattr(draft, f"{role}_token", None), getattr(draft, f"{role}_token_id", None))
        target_pair = (getattr(target, f"{role}_token", None), getattr(target, f"{role}_token_id", None))
        if draft_pair != target_pair:
            findings.append({
                "aspect": "special_tokens", "status": FAIL, "role": role,
                "draft": list(draft_pair), "target": list(target_pair),
                "message": f"{role} token differs: draft {token_label(*draft_pair)}, "
                           f"target {token_label(*target_pair)}",
            })
    draft_special = dict(zip(draft.all_special_tokens, draft.all_special_ids))
    target_special = dict(zip(target.all_special_tokens, target.all_special_ids))
    for side, ours, theirs in (("draft", draft_special, target_special), ("target", target_special, draft_special)):
        for token in ours:
            if token not in theirs:
                if side == "draft" and beyond is not None and ours[token] >= beyond:
                    continue  # past the target's vocabulary: the vocab finding's rule
                findings.append({
                    "aspect": "special_tokens", "status": FAIL, "token": token, "side": side,
                    "message": f"special token {token!r} (id {ours[token]}) only in {side}",
                })
    return findings


def _compare_encoding_settings(draft_dir: Path, target_dir: Path) -> list[dict]:
    # A warning, not a failure: an explicit default on one side and an absent key on the other
    # behave the same; the golden encodings show whether a difference changes any ids.
    draft_config = _read_json(draft_dir / "tokenizer_config.json") or {}
    target_config = _read_json(target_dir / "tokenizer_config.json") or {}
    findings = []
    for key in ENCODING_SETTINGS:
        if draft_config.get(key) != target_config.get(key):
            findings.append({
                "aspect": "tokenizer_config", "status": WARN, "key": key,
                "message": f"tokenizer_config.json {key} differs: draft {draft_config.get(key)!r}, "
                           f"target {target_config.get(key)!r}",
            })
    return findings


def _compare_embedding_sizes(draft_dir: Path, target_dir: Path, draft_length: int,
                             target_length: int, relation: str | None = None) -> tuple[list[dict], dict[str, float]]:
    draft_size, target_size = _config_vocab_size(draft_dir), _config_vocab_size(target_dir)
    if draft_size is None or target_size is None:
        return [], {}
    figures = {"draft_vocab_size": draft_size, "target_vocab_size": target_size}
    findings = []
    for side, size, length in (("draft", draft_size, draft_length), ("target", target_size, target_length)):
        if size < length:
            findings.append({
                "aspect": "embedding_size", "status": FAIL,
                "message": f"{side} config.json vocab_size {size} is smaller than its tokenizer "
                           f"({length} tokens): ids from {size} up have no embedding",
            })
    if not findings and draft_size != target_size and relation != "prefix":  # a prefix: the vocab finding
        # Rows past the target's tokenizer are never produced by encoding with it: padding (e.g. to
        # a multiple of 64 for fast matmuls) or draft tokens past the target's (BEYOND_TARGET_RULE).
        findings.append({
            "aspect": "embedding_size", "status": WARN, "padded_from": target_length,
            "message": f"embedding sizes differ (draft vocab_size {draft_size}, target {target_size}): "
                       + BEYOND_TARGET_RULE.format(n=target_length)
                       + "; vLLM 0.33 refuses draft/target pairs whose vocab_size differs unless "
                         "use_heterogeneous_vocab (vllm/config/speculative.py:2040-2052)",
        })
    return findings, figures


def _compare_golden_encodings(draft, target, golden) -> tuple[list[dict], dict]:
    import jinja2

    mismatches, skipped, errors = [], [], []
    compared = 0
    for record in golden.records:
        try:
            draft_ids = record.encode(draft)
            target_ids = record.encode(target)
        except ModelReferenceError:
            skipped.append(record.id)  # no chat template: the chat_template check reports it
            continue
        except jinja2.TemplateError as exc:
            errors.append({"record": record.id, "error": " ".join(str(exc).split())[:200]})
            continue
        compared += 1
        difference = first_token_difference(draft_ids, target_ids, draft, target)
        if difference is not None:
            mismatches.append({"record": record.id, "category": record.category, **difference})

    findings = []
    if mismatches:
        first = mismatches[0]
        more = f" (and {len(mismatches) - 1} more)" if len(mismatches) > 1 else ""
        findings.append({
            "aspect": "golden_encoding", "status": FAIL,
            "message": f"golden prompt '{first['record']}' encodes differently at token "
                       f"{first['position']}: draft {token_label(first['draft_token'], first['draft_id'])}, "
                       f"target {token_label(first['target_token'], first['target_id'])}{more}",
        })
    if errors:
        findings.append({
            "aspect": "golden_encoding", "status": FAIL,
            "message": f"chat template fails on golden prompt '{errors[0]['record']}': {errors[0]['error']}",
        })
    evidence = {"set": golden.name, "version": golden.version, "content_sha256": golden.content_sha256,
                "compared": compared, "mismatches": mismatches[:50], "skipped": skipped, "errors": errors}
    return findings, evidence


def _part_finding(part: str, difference: tuple[str, Any, Any]) -> dict:
    key, draft_value, target_value = difference
    return {
        "aspect": part, "status": FAIL, "path": key,
        "message": f"{part} differs at {key}: draft {_short(draft_value)}, target {_short(target_value)}",
    }


def _tokenizer_json(model_dir: Path, tokenizer) -> dict | None:
    data = _read_json(model_dir / "tokenizer.json")
    if data is not None:
        return data
    backend = getattr(tokenizer, "backend_tokenizer", None)  # converted from a slow tokenizer
    return json.loads(backend.to_str()) if backend is not None else None


def _config_vocab_size(model_dir: Path) -> int | None:
    config = _read_json(model_dir / "config.json") or {}
    size = config.get("vocab_size")
    if size is None and isinstance(config.get("text_config"), dict):  # multimodal wrappers
        size = config["text_config"].get("vocab_size")
    return size


def _read_json(path: Path) -> dict | None:
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelReferenceError(f"{path}: not valid JSON: {exc}") from None


def _merge_text(merge) -> str:
    # tokenizers >= 0.20 saves merges as ["a", "b"]; older files as "a b".
    return " ".join(merge) if isinstance(merge, list) else merge


def _at(items: list, index: int):
    return items[index] if index < len(items) else "<none>"


def _short(value: Any, limit: int = 80) -> str:
    text = json.dumps(value, ensure_ascii=False, sort_keys=True) if not isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def run(context: CheckContext) -> CheckResult:
    """The tokenizer check of a validation: the draft's tokenizer against the target's; a head
    drafts the target's ids, so for a head its vocabulary's fit to the target (head_vocabulary)."""
    if context.config.method.has_head:
        from specreg.validators import head_vocabulary

        return head_vocabulary.run(context)
    tokenizers = context.compared_tokenizers(CHECK_NAME)
    if isinstance(tokenizers, CheckResult):
        return tokenizers
    return check_tokenizer_alignment(context.draft_dir, context.target_dir, context.golden, **tokenizers)


CHECK = Check(CHECK_NAME, run)

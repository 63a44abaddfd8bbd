"""Chat-template alignment: draft and target must turn a conversation into the same ids.

The draft is fed the target's context; if its template renders the same conversation
differently (a missing newline, another role tag) it drafts from a prompt the target never
sees, and acceptance drops with no error anywhere. Each golden conversation is rendered by
both templates, with and without the generation prompt, and compared as text and as ids.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from specreg.core.differences import first_difference, first_token_difference
from specreg.core.types import FAIL, SKIP, CheckResult, summarize_findings
from specreg.runtime.loading import load_tokenizer
from specreg.validators.context import Check, CheckContext

CHECK_NAME = "chat_template"
CONTEXT_CHARS = 20
MAX_EXAMPLES = 20


def check_chat_template_alignment(draft_dir: str | Path, target_dir: str | Path, golden, *,
                                  draft_tokenizer=None, target_tokenizer=None) -> CheckResult:
    """Render every ``messages`` record of a GoldenSet with both chat templates and compare.

    draft_dir, target_dir: local model folders (their tokenizers are loaded unless given).
    golden: a GoldenSet. Returns a CheckResult "chat_template": skip when the set has no
    messages records, fail when a side has no template, a render fails, or any render differs
    in text or token ids (the first difference shown with offset and context).
    """
    conversations = golden.chat_records
    if not conversations:
        return CheckResult(CHECK_NAME, SKIP,
                           f"golden set '{golden.name}' has no messages records; chat templates not compared",
                           {"set": golden.name}, {"conversations": 0})
    draft = draft_tokenizer if draft_tokenizer is not None else load_tokenizer(draft_dir)
    target = target_tokenizer if target_tokenizer is not None else load_tokenizer(target_dir)
    draft_template, target_template = template_text(draft), template_text(target)
    evidence = {
        "set": golden.name,
        "draft_template_sha256": _sha256(draft_template),
        "target_template_sha256": _sha256(target_template),
        "templates_identical": draft_template == target_template,
    }

    missing = [side for side, t in (("draft", draft_template), ("target", target_template)) if not t]
    if missing:
        who = "neither model has a" if len(missing) == 2 else f"the {missing[0]} has no"
        summary = (f"{who} chat template, but golden set '{golden.name}' has "
                   f"{len(conversations)} messages records that must be rendered through one")
        return CheckResult(CHECK_NAME, FAIL, summary, evidence, {"conversations": len(conversations)})

    text_mismatches, token_mismatches, render_errors, renders = compare_renders(conversations, draft, target)
    findings = render_findings(text_mismatches, token_mismatches, render_errors)
    status, summary = summarize_findings(
        findings, f"chat templates agree on {len(conversations)} conversations of '{golden.name}' "
                  f"({renders} renders, with and without the generation prompt)")
    evidence.update({
        "findings": findings,
        "text_mismatches": text_mismatches[:MAX_EXAMPLES],
        "token_mismatches": token_mismatches[:MAX_EXAMPLES],
        "render_errors": render_errors[:MAX_EXAMPLES],
    })
    figures = {
        "conversations": len(conversations),
        "renders_compared": renders,
        "text_mismatches": len(text_mismatches),
        "token_mismatches": len(token_mismatches),
        "render_errors": len(render_errors),
    }
    return CheckResult(CHECK_NAME, status, summary, evidence, figures)


def compare_renders(conversations, draft, target) -> tuple[list[dict], list[dict], list[dict], int]:
    """Each conversation rendered by both templates, with and without the generation prompt ->
    (text mismatches, token-id mismatches, render errors, renders compared)."""
    import jinja2

    text_mismatches, token_mismatches, render_errors = [], [], []
    renders = 0
    for record in conversations:
        for generation_prompt in (True, False):
            where = {"record": record.id, "add_generation_prompt": generation_prompt}
            rendered = {}
            for side, tokenizer in (("draft", draft), ("target", target)):
                try:
                    rendered[side] = record.render(tokenizer, add_generation_prompt=generation_prompt)
                except jinja2.TemplateError as exc:
                    render_errors.append({**where, "side": side, "error": " ".join(str(exc).split())[:200]})
            if len(rendered) < 2:
                continue
            renders += 1
            offset = first_difference(rendered["draft"], rendered["target"])
            if offset is not None:
                text_mismatches.append({**where, "offset": offset,
                                        "draft_context": _context(rendered["draft"], offset),
                                        "target_context": _context(rendered["target"], offset)})
            # Ids too: equal text can still split differently when the tokenizers differ.
            difference = first_token_difference(
                draft.encode(rendered["draft"], add_special_tokens=False),
                target.encode(rendered["target"], add_special_tokens=False), draft, target)
            if difference is not None:
                token_mismatches.append({**where, **difference})
    return text_mismatches, token_mismatches, render_errors, renders


def render_findings(text_mismatches: list[dict], token_mismatches: list[dict], render_errors: list[dict]) -> list[dict]:
    """One finding per kind of difference, naming its first case."""
    findings = []
    if render_errors:
        first = render_errors[0]
        findings.append({"aspect": "render", "status": FAIL,
                         "message": f"{first['side']} chat template fails on record '{first['record']}': "
                                    f"{first['error']}"})
    if text_mismatches:
        first = text_mismatches[0]
        findings.append({"aspect": "text", "status": FAIL,
                         "message": f"chat templates render record '{first['record']}' "
                                    f"({_prompt_label(first)}) differently at character {first['offset']}: "
                                    f"draft {first['draft_context']}, target {first['target_context']}"
                                    + _more(text_mismatches)})
    if token_mismatches:
        first = token_mismatches[0]
        findings.append({"aspect": "token_ids", "status": FAIL,
                         "message": f"rendered record '{first['record']}' ({_prompt_label(first)}) "
                                    f"encodes differently at token {first['position']}: draft "
                                    f"{first['draft_token']!r} (id {first['draft_id']}), target "
                                    f"{first['target_token']!r} (id {first['target_id']})"
                                    + _more(token_mismatches)})
    return findings


def template_text(tokenizer) -> str | None:
    """The tokenizer's default chat template source, or None when it has none."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # named templates ("default", "tool_use", ...)
        template = template.get("default")
    return template or None


def _context(text: str, offset: int) -> str:
    # repr shows the invisible differences (newlines, spaces) that templates usually differ in.
    start = max(0, offset - CONTEXT_CHARS)
    before, after = text[start:offset], text[offset:offset + CONTEXT_CHARS]
    # "^" stands between the two quoted halves, at the offset.
    return (("..." if start else "") + repr(before) + " ^ " + repr(after)
            + ("..." if offset + CONTEXT_CHARS < len(text) else ""))


def _prompt_label(mismatch: dict) -> str:
    return "with generation prompt" if mismatch["add_generation_prompt"] else "without generation prompt"


def _more(items: list) -> str:
    return f" (and {len(items) - 1} more renders)" if len(items) > 1 else ""


def _sha256(text: str | None) -> str | None:
    return hashlib.sha256(text.encode("utf-8")).hexdigest() if text else None


def run(context: CheckContext) -> CheckResult:
    """The chat-template check of a validation: the draft's template against the target's."""
    method = context.config.method
    if method.has_head:
        return CheckResult(CHECK_NAME, SKIP, f"the {method.value} head drafts inside the target's own chat context: "
                                             "there is no second template")
    tokenizers = context.compared_tokenizers(CHECK_NAME)
    if isinstance(tokenizers, CheckResult):
        return tokenizers
    return check_chat_template_alignment(context.draft_dir, context.target_dir, context.golden,
                                         draft_tokenizer=tokenizers["draft_tokenizer"],
                                         target_tokenizer=tokenizers["target_tokenizer"])


CHECK = Check(CHECK_NAME, run)

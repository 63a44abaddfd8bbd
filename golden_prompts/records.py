"""A golden set as loaded: its records (chat ``messages`` or a raw ``prompt``, with sampling
settings), how a record becomes the text and token ids a model sees, and the set's content hash
(the canonical JSON every specreg content hash uses, specreg.core.digests.canonical_json)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from specreg.core.digests import canonical_json, sha256_hex
from specreg.errors import ModelReferenceError
from specreg.golden_prompts.template_sandbox import render_chat


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
        return render_chat(tokenizer, self.message_dicts(), self.id, add_generation_prompt)

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


SHIPPED = "shipped"  # a GoldenRef's source for a set shipped with specreg (named by its name)


@dataclass(frozen=True)
class GoldenRef:
    """Which golden set a command uses, as resolved once where the command starts
    (loader.load_golden_set): the set's own name (what a validation run records), where it came
    from (``SHIPPED``, or the path of the file) and its content hash, by which the gate matches
    validation runs."""

    name: str
    source: str
    sha256: str

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "source": self.source, "sha256": self.sha256}


@dataclass(frozen=True)
class GoldenSet:
    """A loaded golden set; ``content_sha256`` hashes name, version and records canonically.
    ``shipped``: one of specreg's own sets, loaded by its name."""

    name: str
    version: str
    source: Path | None
    content_sha256: str
    records: tuple[GoldenRecord, ...]
    description: str = ""
    shipped: bool = False

    @property
    def reference(self) -> GoldenRef:
        """This set as a GoldenRef: the hash of the very records loaded here."""
        where = SHIPPED if self.shipped else str(self.source) if self.source is not None else "<golden set>"
        return GoldenRef(self.name, where, self.content_sha256)

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
    return sha256_hex(canonical_json({"name": name, "version": version, "records": [r.to_dict() for r in records]}))

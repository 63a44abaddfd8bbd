"""The drafting methods the registry knows, one descriptor each: the facts the CLI, the API, the
validators and the review need about a method without running it. What a method does at run time
lives in its runtime module, runtime/methods/<name>.py (its METHOD: loading and drafter); the
serving engines' translation in registry/deploy/engines/. Adding a method is its runtime module
and one entry here; nothing else branches on a method's name (tests/test_architecture.py).

No heavy imports: the gate and the CLI read this.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from specreg.core.suffix_settings import SuffixSettings
from specreg.errors import UsageError


@dataclass(frozen=True)
class MethodDescriptor:
    name: str  # as registered, exported and named by vLLM's `method`
    summary: str
    # what drafts: "draft model" (a separate causal LM, --draft), "head" (a head directory, --draft,
    # reading the target's hidden states), "target" (layers inside the target: no --draft),
    # "sequence" (no model: the tokens seen so far; no --draft)
    drafts_with: str
    tree: str = "never"  # a candidate tree: "never", "optional" (chain or tree) or "required"
    prompt_lookup: bool = False  # takes prompt_lookup_min / prompt_lookup_max
    suffix_settings: bool = False  # takes vLLM's suffix_decoding_* settings (core/suffix_settings.py)
    depth_limited_by_heads: bool = False  # head i drafts depth i + 1: the depth needs as many heads
    demo_builder: str | None = None  # the builders/ module whose build_demo(...) makes a demo drafter
    real_builder: str | None = None  # the builders/ module whose build_real(...) trains one for the real pair
    # exports: False when no export format writes the method; export_refusal says why no engine
    # specreg targets can serve it (None: not written yet), for a format whose engine module's
    # refusal has no words of its own for the method (exports.refuse_pair)
    # a block drafter (DFlash, DSpark) drafts a fixed number of tokens a step, read from its head:
    # k defaults to it and a k that disagrees is refused (dflash_checkpoint.block_draft_length)
    draft_length_from_head: bool = False
    # all k drafts of a step come from one forward (block drafters, P-EAGLE): a step's drafting costs
    # one forward whatever k
    drafts_in_one_forward: bool = False
    exported: bool = True
    export_refusal: str | None = None
    article: str = "a"  # "a draft_model pair", "an ngram pair"

    @property
    def model_free(self) -> bool:
        """Drafts without any model: no draft law beyond a point mass, no draft forwards."""
        return self.drafts_with == "sequence"

    @property
    def has_head(self) -> bool:
        """Drafts from the target's own hidden states (the --draft directory, if any, is a head)."""
        return self.drafts_with in ("head", "target")

    @property
    def takes_draft(self) -> bool:
        """Registration needs a --draft directory (a model or a head)."""
        return self.drafts_with in ("draft model", "head")

    @property
    def draft_law(self) -> str:
        """What q is when the runtime samples, in words (the distribution check's report)."""
        return {"draft model": "the draft model's distribution",
                "sequence": f"a point mass on the target's top token ({self.name})"}.get(
            self.drafts_with, f"the {self.name} head's distribution")


MEDUSA_REFUSAL = (
    "no engine version specreg targets serves Medusa heads stored apart from their base model: vLLM 0.33 "
    "has no medusa method (vllm/config/speculative.py:74-82 SpeculativeMethod), SGLang 0.5.23 has no Medusa "
    "algorithm (sglang/srt/speculative/spec_info.py:39-47 SpeculativeAlgorithm), TensorRT-LLM 1.2's Medusa runs "
    "only on its TensorRT engine flow (llm_args.py MedusaDecodingConfig.supports_backend refuses pytorch, "
    "trtllm-serve's backend), and TGI 3.3 reads Medusa heads only from a combined model repository "
    "(server/text_generation_server/models/__init__.py:522-551)")

METHODS: dict[str, MethodDescriptor] = {m.name: m for m in (
    MethodDescriptor("draft_model", "a separate small causal LM", "draft model"),
    MethodDescriptor("ngram", "prompt lookup, no model", "sequence", prompt_lookup=True, article="an"),
    MethodDescriptor("eagle3", "an EAGLE-3 head on the target's hidden states", "head", tree="optional",
                     demo_builder="demo_heads", real_builder="real_head"),
    MethodDescriptor("medusa", "Medusa heads on the target's last hidden state, verified as a tree", "head",
                     tree="required", depth_limited_by_heads=True, demo_builder="demo_medusa", exported=False,
                     export_refusal=MEDUSA_REFUSAL),
    MethodDescriptor("mtp", "multi-token-prediction layers shipped inside the target", "target",
                     demo_builder="demo_mtp"),
    MethodDescriptor("dflash", "a DFlash block drafter: a block of mask tokens drafted in one forward from the "
                     "target's hidden states", "head", draft_length_from_head=True, drafts_in_one_forward=True,
                     demo_builder="demo_dflash"),
    MethodDescriptor("dspark", "a DSpark block drafter: DFlash's block forward, then a Markov head sampled "
                     "left to right", "head", draft_length_from_head=True, drafts_in_one_forward=True),
    MethodDescriptor("peagle", "a P-EAGLE head: an EAGLE-3 head drafting all k tokens in one forward from mask-token "
                     "placeholders (vLLM's eagle3 with parallel_drafting)", "head", drafts_in_one_forward=True,
                     demo_builder="demo_peagle"),
    MethodDescriptor("suffix", "suffix decoding: suffix trees of the request's own tokens, no model", "sequence",
                     suffix_settings=True),
)}


class MethodEnum(str, enum.Enum):
    """A registered method's name; its facts are its descriptor's."""

    @property
    def descriptor(self) -> MethodDescriptor:
        return METHODS[self.value]

    @property
    def has_head(self) -> bool:
        """Drafts from the target's own hidden states (the --draft directory, if any, is a head)."""
        return self.descriptor.has_head


# SpecMethod.DRAFT_MODEL == "draft_model" ...: one member per descriptor, in the table's order
SpecMethod = MethodEnum("SpecMethod", {name.upper(): name for name in METHODS})


@dataclass(frozen=True)
class SpecConfig:
    """The speculative configuration bound into a pair version: the one statement of it that the
    registry stores, the exports translate and the runtime decodes (DecodeConfig.from_spec)."""

    method: SpecMethod
    num_speculative_tokens: int
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    max_batch_size_for_speculation: int | None = None
    # Candidate tree (Medusa / EAGLE top-k): paths of top-i choices per depth, e.g. ((0,), (1,), (0, 0)).
    tree: tuple[tuple[int, ...], ...] | None = None
    # What registration read of the head (specreg.core.heads.spec.HeadSpec.to_dict() + fit notes);
    # for MTP the target tensors that form the module.
    head: dict[str, Any] | None = None
    # suffix: vLLM's suffix_decoding_* settings
    suffix: SuffixSettings | None = None

    def to_dict(self) -> dict[str, Any]:
        data = {
            "method": self.method.value,
            "num_speculative_tokens": self.num_speculative_tokens,
            "prompt_lookup_min": self.prompt_lookup_min,
            "prompt_lookup_max": self.prompt_lookup_max,
            "max_batch_size_for_speculation": self.max_batch_size_for_speculation,
        }
        # only when set: a draft-model or ngram binding hashes exactly as before these existed
        if self.tree is not None:
            data["tree"] = [list(path) for path in self.tree]
        if self.head is not None:
            data["head"] = self.head
        if self.suffix is not None:
            data["suffix"] = self.suffix.to_dict()
        return data


@dataclass(frozen=True)
class HeadFormat:
    """What a head of one format (specreg.core.heads' HeadSpec.method) is, for the checks that bind
    it to a target (specreg.core.heads.fit, .vocabulary)."""

    name: str
    method: str | None  # the registered method that runs it; None: none does (EAGLE-1/2)
    inside_target: bool = False  # its layers are the target's own (read from the target's directory)
    aux_layers: bool = False  # reads aux hidden states at layer ids it names (EAGLE-3)
    block: bool = False  # a block drafter: target layers and mask token checked by dflash_checkpoint
    # without embed_tokens of its own it reads the target's embeddings, so its width is the target's
    shares_embeddings: bool = False
    vocab_size_field: str = "vocab_size"  # where the head states the vocabulary its ids map into
    vocab_map_needed: bool = False  # a draft vocabulary smaller than the target's needs d2t


HEAD_FORMATS: dict[str, HeadFormat] = {f.name: f for f in (
    HeadFormat("eagle3", "eagle3", aux_layers=True, shares_embeddings=True,
               vocab_size_field="transformer_layer_config.vocab_size", vocab_map_needed=True),
    HeadFormat("peagle", "peagle", aux_layers=True, shares_embeddings=True,
               vocab_size_field="transformer_layer_config.vocab_size", vocab_map_needed=True),
    HeadFormat("eagle", None, shares_embeddings=True),
    HeadFormat("medusa", "medusa", vocab_size_field="rows of each head's output layer"),
    HeadFormat("mtp", "mtp", inside_target=True),
    HeadFormat("dflash", "dflash", block=True, shares_embeddings=True, vocab_map_needed=True),
    HeadFormat("dspark", "dspark", block=True, shares_embeddings=True, vocab_map_needed=True),
)}

DEFAULT_METHOD = "draft_model"  # what --method is when not given


def method_descriptor(name: str) -> MethodDescriptor:
    """The descriptor of a method name; UsageError naming the known ones otherwise."""
    descriptor = METHODS.get(str(getattr(name, "value", name)))
    if descriptor is None:
        raise UsageError(f"unknown method {name!r}: use one of {', '.join(METHODS)}")
    return descriptor


def tree_methods() -> tuple[str, ...]:
    return tuple(name for name, m in METHODS.items() if m.tree != "never")

"""A target and its drafter, checked once before any forward pass."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specreg.errors import RuntimeConfigError


@dataclass
class ModelPair:
    """What the decode loop runs: the target, an optional draft model, one shared tokenizer.

    vocab_size is the number of ids verified: the models' common vocabulary, or the tokenizer's
    length when the embedding matrices differ only by padding rows beyond it.
    """

    target: Any
    tokenizer: Any
    draft: Any = None
    vocab_size: int = 0

    @property
    def device(self):
        return next(self.target.parameters()).device


def output_vocab_size(model) -> int:
    return int(model.get_output_embeddings().weight.shape[0])


def make_pair(target, tokenizer, draft=None, draft_tokenizer=None, *, draft_name: str = "draft") -> ModelPair:
    """Check that a target and a draft can be verified against each other -> ModelPair.

    Raises RuntimeConfigError (before any forward pass) when the draft has no tokenizer, when
    the two tokenizers map tokens to different ids, or when the embedding sizes differ by more
    than padding beyond the shared tokenizer's length.
    """
    target_vocab = output_vocab_size(target)
    if draft is None:
        return ModelPair(target=target, tokenizer=tokenizer, draft=None, vocab_size=target_vocab)
    if draft_tokenizer is None:
        raise RuntimeConfigError(f"{draft_name}: the draft model has no tokenizer; a draft must ship "
                                 "the tokenizer it was trained with")
    if tokenizer is not None:
        check_same_vocabulary(tokenizer, draft_tokenizer, draft_name)
    draft_vocab = output_vocab_size(draft)
    extends = tokenizer is not None and len(draft_tokenizer) > len(tokenizer)  # tokens after the target's
    if draft_vocab == target_vocab and not extends:
        return ModelPair(target=target, tokenizer=tokenizer, draft=draft, vocab_size=target_vocab)
    shared = len(tokenizer) if tokenizer is not None else None
    if shared is None or min(draft_vocab, target_vocab) < shared:
        raise RuntimeConfigError(
            f"{draft_name}: vocab_size differs (target {target_vocab}, draft {draft_vocab}) and the "
            f"smaller one does not cover the tokenizer's {shared} tokens"
        )
    # the extra rows are padding or draft tokens past the target's vocabulary (BEYOND_TARGET_RULE):
    # verify over the target tokenizer's ids only
    return ModelPair(target=target, tokenizer=tokenizer, draft=draft, vocab_size=shared)


def vocabulary_relation(draft_vocab: dict[str, int], target_vocab: dict[str, int]) -> str | None:
    """How a draft's token -> id map stands to the target's: "same"; "extends" (every target token
    at its id, the draft's other tokens after the target's vocabulary); "prefix" (the draft's tokens
    are the target's first ones, the target has more); None otherwise."""
    if draft_vocab == target_vocab:
        return "same"
    draft_only = [i for t, i in draft_vocab.items() if target_vocab.get(t) != i]
    target_only = [i for t, i in target_vocab.items() if draft_vocab.get(t) != i]
    if not target_only and min(draft_only) >= len(target_vocab):
        return "extends"
    if not draft_only and min(target_only) >= len(draft_vocab):
        return "prefix"
    return None


# One rule for every draft id past the target's vocabulary, tokens the draft's tokenizer adds after
# the target's or embedding rows beyond it: engines tokenize with the target's tokenizer (vLLM's
# draft ModelConfig takes the target's), so those ids are never fed to the draft, and a draft
# token there is never the target's; the runtime verifies the target's ids only (ModelPair.vocab_size).
BEYOND_TARGET_RULE = ("engines feed the draft the target's token ids, so draft ids from {n} up are never fed and "
                      "never accepted; specreg verifies ids below {n} only")
# A draft that knows only the target's first tokens cannot propose the others, which are tokens,
# not padding. vLLM 0.33 serves such a pair only in its heterogeneous-vocabulary mode, which this
# runtime does not run; without it, it refuses differing vocab sizes.
PREFIX_REFUSAL = ("the draft's vocabulary is a strict prefix of the target's ({draft} of {target} tokens, the same "
                  "ids): it can never propose the target's tokens from {draft} up (tokens, not padding); vLLM 0.33 "
                  "serves such a pair only with use_heterogeneous_vocab (draft_model, greedy drafting, the draft's "
                  "own tokenizer: vllm/config/speculative.py:496-500 and 1995-2005) and otherwise refuses differing "
                  "vocab sizes (speculative.py:2040-2052), SGLang compares the whole token dictionaries; specreg "
                  "neither validates nor exports that mode")


def check_same_vocabulary(tokenizer, draft_tokenizer, draft_name: str = "draft") -> None:
    """Raise RuntimeConfigError naming the first token whose id differs between the tokenizers. A
    draft whose tokenizer only adds tokens after the target's vocabulary passes (BEYOND_TARGET_RULE);
    one that knows only a prefix of it does not (PREFIX_REFUSAL)."""
    target_vocab = tokenizer.get_vocab()
    draft_vocab = draft_tokenizer.get_vocab()
    same_eos = tokenizer.eos_token_id == draft_tokenizer.eos_token_id
    relation = vocabulary_relation(draft_vocab, target_vocab)
    if relation in ("same", "extends") and same_eos:
        return
    if relation == "prefix":
        raise RuntimeConfigError(f"{draft_name}: " + PREFIX_REFUSAL.format(draft=len(draft_vocab),
                                                                            target=len(target_vocab)))
    for token, token_id in sorted(target_vocab.items(), key=lambda item: item[1]):
        if draft_vocab.get(token) != token_id:
            raise RuntimeConfigError(
                f"{draft_name}: tokenizer differs from the target's: token {token!r} is id {token_id} "
                f"in the target, {draft_vocab.get(token)} in the draft"
            )
    extra = sorted(set(draft_vocab) - set(target_vocab))
    if extra and relation != "extends":
        raise RuntimeConfigError(f"{draft_name}: tokenizer has {len(extra)} tokens the target's lacks, "
                                 f"e.g. {extra[0]!r}")
    raise RuntimeConfigError(f"{draft_name}: eos_token_id {draft_tokenizer.eos_token_id} differs from "
                             f"the target's {tokenizer.eos_token_id}")

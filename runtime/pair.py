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
    if draft_vocab == target_vocab:
        return ModelPair(target=target, tokenizer=tokenizer, draft=draft, vocab_size=target_vocab)
    shared = len(tokenizer) if tokenizer is not None else None
    if shared is None or min(draft_vocab, target_vocab) < shared:
        raise RuntimeConfigError(
            f"{draft_name}: vocab_size differs (target {target_vocab}, draft {draft_vocab}) and the "
            f"smaller one does not cover the tokenizer's {shared} tokens"
        )
    # the extra rows are padding no tokenizer id maps to: verify over the shared ids only
    return ModelPair(target=target, tokenizer=tokenizer, draft=draft, vocab_size=shared)


def check_same_vocabulary(tokenizer, draft_tokenizer, draft_name: str = "draft") -> None:
    """Raise RuntimeConfigError naming the first token whose id differs between the tokenizers."""
    target_vocab = tokenizer.get_vocab()
    draft_vocab = draft_tokenizer.get_vocab()
    if target_vocab == draft_vocab and tokenizer.eos_token_id == draft_tokenizer.eos_token_id:
        return
    for token, token_id in sorted(target_vocab.items(), key=lambda item: item[1]):
        if draft_vocab.get(token) != token_id:
            raise RuntimeConfigError(
                f"{draft_name}: tokenizer differs from the target's: token {token!r} is id {token_id} "
                f"in the target, {draft_vocab.get(token)} in the draft"
            )
    extra = sorted(set(draft_vocab) - set(target_vocab))
    if extra:
        raise RuntimeConfigError(f"{draft_name}: tokenizer has {len(extra)} tokens the target's lacks, "
                                 f"e.g. {extra[0]!r}")
    raise RuntimeConfigError(f"{draft_name}: eos_token_id {draft_tokenizer.eos_token_id} differs from "
                             f"the target's {tokenizer.eos_token_id}")


def load_pair(target_path, draft_path=None, device: str = "cpu", dtype="float32") -> ModelPair:
    """Load a target (and a draft model) from directories and check them -> ModelPair."""
    from specreg.runtime.loading import has_tokenizer, load_model, load_tokenizer, resolve_device

    device = resolve_device(device)
    tokenizer = load_tokenizer(target_path)
    target = load_model(target_path, device, dtype)
    if draft_path is None:
        return make_pair(target, tokenizer)
    if not has_tokenizer(draft_path):
        raise RuntimeConfigError(f"{draft_path}: the draft model has no tokenizer files")
    draft_tokenizer = load_tokenizer(draft_path)
    # check tokenizers before spending time on the draft's weights
    check_same_vocabulary(tokenizer, draft_tokenizer, str(draft_path))
    draft = load_model(draft_path, device, dtype)
    return make_pair(target, tokenizer, draft, draft_tokenizer, draft_name=str(draft_path))

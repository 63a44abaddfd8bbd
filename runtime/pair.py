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


def load_pair(target_path, draft_path=None, device: str = "cpu", dtype="float32", *,
              target_fingerprint=None, draft_fingerprint=None, method: str = "draft_model") -> ModelPair:
    """Load a target and what drafts for it from directories and check them -> ModelPair.

    method "draft_model": draft_path is a causal LM with its own tokenizer; "eagle3": draft_path is
    an EAGLE-3 head (speculators or original EAGLE layout), checked against the target before any
    forward (eagle3.check_head_fits); "medusa": draft_path holds Medusa heads (medusa.load_medusa_heads);
    "mtp": draft_path is None, the drafter is the target's own MTP layers (mtp.read_runnable_mtp, checked
    before the target loads, then mtp.load_mtp_head, whose tensors are read from bytes checked against
    target_fingerprint when given); "ngram": draft_path is ignored. The decode loop builds the
    drafter from the pair and DecodeConfig.method (drafters.make_drafter).
    *_fingerprint: the ModelFingerprint each model was registered with; when given, what is
    loaded is checked against it as it is read (loading.load_model / load_tokenizer); a head's
    weights are not re-checked here (registration binds them, specreg.core.heads)."""
    from specreg.runtime.loading import has_tokenizer, load_model, load_tokenizer, resolve_device

    device = resolve_device(device)
    if method == "mtp":
        from specreg.runtime.mtp import load_mtp_head, read_runnable_mtp

        if draft_path is not None:
            raise RuntimeConfigError(f"method 'mtp' drafts with the target's own MTP layers: no draft directory "
                                     f"({draft_path})")
        from transformers.utils import logging as transformers_logging

        spec = read_runnable_mtp(target_path)  # refuses a family it does not run before loading the target
        tokenizer = load_tokenizer(target_path, expected=target_fingerprint)
        # the plain model leaves the MTP tensors out by design: no "UNEXPECTED keys" report for them
        verbosity = transformers_logging.get_verbosity()
        transformers_logging.set_verbosity_error()
        try:
            target = load_model(target_path, device, dtype, expected=target_fingerprint)
        finally:
            transformers_logging.set_verbosity(verbosity)
        return ModelPair(target=target, tokenizer=tokenizer, vocab_size=output_vocab_size(target),
                         draft=load_mtp_head(spec, target, expected=target_fingerprint))
    tokenizer = load_tokenizer(target_path, expected=target_fingerprint)
    target = load_model(target_path, device, dtype, expected=target_fingerprint)
    if method == "eagle3":
        from specreg.runtime.eagle3 import load_eagle3_head

        if draft_path is None:
            raise RuntimeConfigError("method 'eagle3' needs the EAGLE-3 head's directory")
        return ModelPair(target=target, tokenizer=tokenizer, draft=load_eagle3_head(draft_path, target),
                         vocab_size=output_vocab_size(target))
    if method == "medusa":
        from specreg.runtime.medusa import load_medusa_heads

        if draft_path is None:
            raise RuntimeConfigError("method 'medusa' needs the Medusa heads' directory")
        return ModelPair(target=target, tokenizer=tokenizer, draft=load_medusa_heads(draft_path, target),
                         vocab_size=output_vocab_size(target))
    if draft_path is None or method == "ngram":
        return make_pair(target, tokenizer)
    if not has_tokenizer(draft_path):
        raise RuntimeConfigError(f"{draft_path}: the draft model has no tokenizer files")
    # Engines tokenize with the target's tokenizer and feed the draft those ids (vLLM's draft
    # ModelConfig takes tokenizer=target's): read the draft's files with the target's class, so
    # that a class transformers picks from the draft's model_type adds no phantom tokens.
    draft_tokenizer = load_tokenizer(draft_path, expected=draft_fingerprint, tokenizer_class=type(tokenizer))
    # check tokenizers before spending time on the draft's weights
    check_same_vocabulary(tokenizer, draft_tokenizer, str(draft_path))
    draft = load_model(draft_path, device, dtype, expected=draft_fingerprint)
    return make_pair(target, tokenizer, draft, draft_tokenizer, draft_name=str(draft_path))


def forward_logits(model, input_ids, cache, logits_to_keep: int = 1, hidden_state_ids: tuple[int, ...] = (),
                   attention_mask=None, position_ids=None):
    """One cached forward: input_ids # [1, n] -> logits # [1, logits_to_keep, vocab] of the last
    positions, appending the n tokens' keys/values to `cache`.

    hidden_state_ids: indices into transformers' `hidden_states` (0 = the embeddings, i = the
    residual stream entering layer i, num_hidden_layers = the final normed output). When given,
    returns (logits, hidden # [1, n, len(ids) * hidden_size]): those states of all n positions,
    concatenated in the order given; this is what self-speculation heads read (EAGLE-3 aux
    states, as vLLM's llama.py collects `hidden_states + residual` before layer idx).

    A plain LlamaForCausalLM runs its decoder stack directly: on tiny models the wrappers of
    model.forward (output recording, two ModelOutput dataclasses, a ModuleList sliced per call)
    cost ~0.15 ms a call, a quarter of the demo draft's one-token step. Same modules, same ops,
    bit-identical logits (tests/runtime compare with model()). Any other model, or one with
    hooks on its top level (accelerate offloading), goes through model() as is.
    """
    import torch

    if not is_plain_llama(model):
        output = model(input_ids=input_ids, cache=cache, use_cache=True, logits_to_keep=logits_to_keep,
                       output_hidden_states=bool(hidden_state_ids), attention_mask=attention_mask,
                       position_ids=position_ids)
        if not hidden_state_ids:
            return output.logits
        return output.logits, torch.cat([output.hidden_states[i] for i in hidden_state_ids], dim=-1)
    from transformers.masking_utils import create_causal_mask

    decoder = model.model
    hidden = decoder.embed_tokens(input_ids)  # [1, n, hidden]
    if position_ids is None:
        past = cache.get_seq_length()
        position_ids = torch.arange(past, past + input_ids.shape[1], device=input_ids.device).view(1, -1)  # [1, n]
    # None for one query without padding (SDPA runs unmasked); a real mask for a block over a cache;
    # a 4-D mask given is used as it is
    mask = attention_mask if attention_mask is not None else create_causal_mask(
        config=decoder.config, inputs_embeds=hidden, attention_mask=None, cache=cache, position_ids=position_ids)
    position_embeddings = decoder.rotary_emb(hidden, position_ids=position_ids)
    states = {}
    for index, layer in enumerate(decoder.layers):
        if index in hidden_state_ids:
            states[index] = hidden
        hidden = layer(hidden, attention_mask=mask, position_embeddings=position_embeddings,
                       position_ids=position_ids, cache=cache, use_cache=True)
    if not hidden_state_ids:
        return model.lm_head(decoder.norm(hidden[:, -logits_to_keep:]))
    normed = decoder.norm(hidden)
    states[len(decoder.layers)] = normed
    return model.lm_head(normed[:, -logits_to_keep:]), torch.cat([states[i] for i in hidden_state_ids], dim=-1)


def is_plain_llama(model) -> bool:
    """True for an unwrapped transformers LlamaForCausalLM whose decoder forward_logits may run."""
    from transformers.models.llama.modeling_llama import LlamaForCausalLM

    return (type(model) is LlamaForCausalLM and not model._forward_hooks and not model._forward_pre_hooks
            and not model.model._forward_hooks and not model.model._forward_pre_hooks
            and not hasattr(model, "_hf_hook") and not hasattr(model.model, "_hf_hook")
            and len(model.model.layers) == model.config.num_hidden_layers)

"""The one cached forward every part of the runtime runs: the decode loop's verification, the
draft model's steps, tree verification and the heads' seeding read the target through it.

Imports only torch and transformers, lazily: the drafting methods and the tree import it without
importing the pair or each other.
"""

from __future__ import annotations

import functools

# forward_logits' index of the last layer's output before the final norm: an EAGLE-3 head's aux
# layer id N, which vLLM collects (models/llama.py: hidden_states + residual after the last
# layer); index num_hidden_layers stays transformers' hidden_states[N], the normed output
LAST_LAYER_OUTPUT = -1


def forward_logits(model, input_ids, cache, logits_to_keep: int = 1, hidden_state_ids: tuple[int, ...] = (),
                   attention_mask=None, position_ids=None):
    """One cached forward: input_ids # [1, n] -> logits # [1, logits_to_keep, vocab] of the last
    positions, appending the n tokens' keys/values to `cache`.

    hidden_state_ids: indices into transformers' `hidden_states` (0 = the embeddings, i = the
    residual stream entering layer i, num_hidden_layers = the final normed output), or
    LAST_LAYER_OUTPUT (the last layer's output before the final norm). When given,
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

    cached = {cache_keyword(): cache}
    if not is_plain_llama(model):
        captured, handle = {}, None
        if LAST_LAYER_OUTPUT in hidden_state_ids:  # the final norm's input
            handle = final_norm(model).register_forward_pre_hook(lambda module, args: captured.update(state=args[0]))
        try:
            output = model(input_ids=input_ids, **cached, use_cache=True, logits_to_keep=logits_to_keep,
                           output_hidden_states=bool(hidden_state_ids), attention_mask=attention_mask,
                           position_ids=position_ids)
        finally:
            if handle is not None:
                handle.remove()
        if not hidden_state_ids:
            return output.logits
        return output.logits, torch.cat([captured["state"] if i == LAST_LAYER_OUTPUT else output.hidden_states[i]
                                         for i in hidden_state_ids], dim=-1)
    from transformers.masking_utils import create_causal_mask

    decoder = model.model
    hidden = decoder.embed_tokens(input_ids)  # [1, n, hidden]
    if position_ids is None:
        past = cache.get_seq_length()
        position_ids = torch.arange(past, past + input_ids.shape[1], device=input_ids.device).view(1, -1)  # [1, n]
    # None for one query without padding (SDPA runs unmasked); a real mask for a block over a cache;
    # a 4-D mask given is used as it is
    mask = attention_mask if attention_mask is not None else create_causal_mask(
        config=decoder.config, inputs_embeds=hidden, attention_mask=None, **cached, position_ids=position_ids)
    position_embeddings = decoder.rotary_emb(hidden, position_ids=position_ids)
    states = {}
    for index, layer in enumerate(decoder.layers):
        if index in hidden_state_ids:
            states[index] = hidden
        hidden = layer(hidden, attention_mask=mask, position_embeddings=position_embeddings,
                       position_ids=position_ids, **cached, use_cache=True)
    if not hidden_state_ids:
        return model.lm_head(decoder.norm(hidden[:, -logits_to_keep:]))
    states[LAST_LAYER_OUTPUT] = hidden
    normed = decoder.norm(hidden)
    states[len(decoder.layers)] = normed
    return model.lm_head(normed[:, -logits_to_keep:]), torch.cat([states[i] for i in hidden_state_ids], dim=-1)


def final_norm(model):
    """The decoder's final norm module (`model.model.norm` in transformers' causal LMs)."""
    from specreg.errors import RuntimeUnsupportedError

    norm = getattr(getattr(model, "model", None), "norm", None)
    if norm is None:
        raise RuntimeUnsupportedError(f"{type(model).__name__} has no model.norm: this runtime cannot read its last "
                                      "layer's output before the final norm (an EAGLE-3 aux layer id N)")
    return norm


@functools.cache
def cache_keyword() -> str:
    """The name under which the installed transformers takes a cache in its models, decoder layers,
    attention modules and create_causal_mask: `cache` from 5.24, `past_key_values` before. A cache
    passed under the other name is not refused: it falls into **kwargs and is silently not used
    (the model keeps a cache of its own, the attention attends to the new tokens alone)."""
    import inspect

    from transformers.masking_utils import create_causal_mask

    return "cache" if "cache" in inspect.signature(create_causal_mask).parameters else "past_key_values"


def is_plain_llama(model) -> bool:
    """True for an unwrapped transformers LlamaForCausalLM whose decoder forward_logits may run."""
    from transformers.models.llama.modeling_llama import LlamaForCausalLM

    return (type(model) is LlamaForCausalLM and not model._forward_hooks and not model._forward_pre_hooks
            and not model.model._forward_hooks and not model.model._forward_pre_hooks
            and not hasattr(model, "_hf_hook") and not hasattr(model.model, "_hf_hook")
            and len(model.model.layers) == model.config.num_hidden_layers)

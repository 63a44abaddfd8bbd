"""DFlash: a block drafter. Each step it drafts a whole block in one forward pass: the block is
the last verified token (the anchor) followed by block_size - 1 mask tokens at the positions after
it, and every block token attends to the target's hidden states of all positions before the
anchor (projected by fc and hidden_norm, injected as keys and values into each layer) and to the
other block tokens. Slot i of the output predicts the token i after the anchor (i >= 1); with
sample_from_anchor, slot i predicts the token i + 1 after it, and every slot drafts.

Written from speculators' model code (models/dflash/core.py _backbone_forward,
model_definitions.py Qwen3DFlashAttention: k_proj/v_proj over [context; block], k_norm, RoPE at
each token's position, no input_layernorm on the context) and vLLM 0.33's serving of it
(model_executor/models/qwen3_dflash.py precompute_and_store_context_kv: the context's keys and
values are cached per position; v1/worker/gpu/spec_decode/dflash: 1 + k queries a request, the
anchor first). Block attention is bidirectional unless the head says causal, as vLLM resolves it
(_dflash_layer_causal). DSpark (dspark.py) runs the same block forward and adds its Markov head.

The drafts of one step are sampled independently per slot from the slot's distribution q_i
(DSpark: conditioned on the previous draft through the Markov bias): the acceptance rule keeps
the target's distribution for any such q (runtime/acceptance_rule.py).

This module imports torch and transformers at import time: import it lazily (as
runtime/methods/__init__.py does).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers.models.qwen3.modeling_qwen3 import Qwen3Config, Qwen3MLP, Qwen3RMSNorm, Qwen3RotaryEmbedding

from specreg.errors import ModelReferenceError, RuntimeConfigError, RuntimeUnsupportedError
from specreg.runtime.methods.base import Method, Proposal
from specreg.runtime.sampling import DraftSampler, draft_token


def rotate_half(x):
    return torch.cat((-x[..., x.shape[-1] // 2:], x[..., : x.shape[-1] // 2]), dim=-1)


def rope(x, cos, sin):
    """x # [b, heads, n, d] at the positions cos/sin # [b, n, d] were made for."""
    return x * cos.unsqueeze(1) + rotate_half(x) * sin.unsqueeze(1)


class BlockLayer(torch.nn.Module):
    """One DFlash decoder layer (Qwen3's, under speculators' names): attention whose keys and
    values are the context's (from the target's states) followed by the block's own."""

    def __init__(self, config: Qwen3Config):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        bias = bool(getattr(config, "attention_bias", False))
        attn = torch.nn.Module()
        attn.q_proj = torch.nn.Linear(config.hidden_size, self.heads * self.head_dim, bias=bias)
        attn.k_proj = torch.nn.Linear(config.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        attn.v_proj = torch.nn.Linear(config.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        attn.o_proj = torch.nn.Linear(self.heads * self.head_dim, config.hidden_size, bias=bias)
        attn.q_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        attn.k_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.self_attn = attn
        self.mlp = Qwen3MLP(config)
        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def keys_values(self, states, cos, sin):
        """states # [b, n, H] (context: fc output after hidden_norm; block: after input_layernorm)
        -> keys # [b, kv_heads, n, d] (k_norm, RoPE), values # [b, kv_heads, n, d]."""
        b, n, _ = states.shape
        keys = self.self_attn.k_norm(self.self_attn.k_proj(states).view(b, n, self.kv_heads, self.head_dim))
        values = self.self_attn.v_proj(states).view(b, n, self.kv_heads, self.head_dim)
        return rope(keys.transpose(1, 2), cos, sin), values.transpose(1, 2)

    def forward(self, hidden, context_keys, context_values, mask, cos, sin):
        """hidden # [b, B, H] the block; context_* # [b, kv_heads, C, d]; mask # [b, 1, B, C + B]."""
        b, n, _ = hidden.shape
        residual = hidden
        hidden = self.input_layernorm(hidden)
        queries = self.self_attn.q_norm(self.self_attn.q_proj(hidden).view(b, n, self.heads, self.head_dim))
        queries = rope(queries.transpose(1, 2), cos, sin)
        keys, values = self.keys_values(hidden, cos, sin)
        keys, values = torch.cat([context_keys, keys], dim=2), torch.cat([context_values, values], dim=2)
        attended = torch.nn.functional.scaled_dot_product_attention(
            queries, keys, values, attn_mask=mask, enable_gqa=self.heads != self.kv_heads)  # [b, heads, B, d]
        hidden = residual + self.self_attn.o_proj(attended.transpose(1, 2).reshape(b, n, -1))
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class BlockDrafterHead(torch.nn.Module):
    """A DFlash (or DSpark) head: fc and hidden_norm over the target's states, the block layers,
    norm and lm_head; embed_tokens and lm_head are the target's when the checkpoint has none (as
    vLLM shares them). `block` is what registration read (dflash_checkpoint: block_size,
    sample_from_anchor, mask_token_id, causal, markov_rank)."""

    def __init__(self, config: Qwen3Config, block: dict, aux_layer_ids, target_hidden: int, draft_vocab: int,
                 target_vocab: int, embed_tokens=None, lm_head=None):
        super().__init__()
        self.config, self.block = config, dict(block)
        self.aux_layer_ids = tuple(aux_layer_ids)
        self.fc = torch.nn.Linear(len(self.aux_layer_ids) * target_hidden, config.hidden_size, bias=False)
        self.hidden_norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.layers = torch.nn.ModuleList([BlockLayer(config) for _ in range(config.num_hidden_layers)])
        self.norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = Qwen3RotaryEmbedding(config)
        self.embed_tokens = embed_tokens if embed_tokens is not None else torch.nn.Embedding(target_vocab, config.hidden_size)
        self.lm_head = lm_head if lm_head is not None else torch.nn.Linear(config.hidden_size, draft_vocab, bias=False)
        self.register_buffer("d2t", torch.zeros(draft_vocab, dtype=torch.long))
        self.markov = None
        if block.get("markov_rank"):
            self.markov = torch.nn.Module()
            self.markov.markov_w1 = torch.nn.Embedding(target_vocab, block["markov_rank"])
            self.markov.markov_w2 = torch.nn.Linear(block["markov_rank"], draft_vocab, bias=False)
        self.target_vocab_size = target_vocab

    @property
    def block_size(self) -> int:
        return self.block["block_size"]

    @property
    def draft_length(self) -> int:
        return self.block["draft_length"]

    def context(self, aux_hidden, positions):
        """The target's states # [1, n, A*H_target] at positions # [1, n] -> per layer (keys,
        values) # [1, kv_heads, n, d]: what vLLM writes into the draft's cache for each position."""
        states = self.hidden_norm(self.fc(aux_hidden))
        cos, sin = self.rotary_emb(states, positions)
        return [layer.keys_values(states, cos, sin) for layer in self.layers]

    def forward(self, anchors, anchor_positions, context_keys, context_values, context_valid):
        """anchors, anchor_positions # [b]; context_* per layer # [b, kv_heads, C, d] padded,
        context_valid # [b, C] -> the draft slots' pre-lm_head states # [b, draft_length, H]."""
        b, size = anchors.shape[0], self.block_size
        block_ids = torch.full((b, size), self.block["mask_token_id"], dtype=torch.long, device=anchors.device)
        block_ids[:, 0] = anchors
        positions = anchor_positions[:, None] + torch.arange(size, device=anchors.device)  # [b, B]
        hidden = self.embed_tokens(block_ids)  # [b, B, H]
        cos, sin = self.rotary_emb(hidden, positions)
        within = torch.ones(size, size, dtype=torch.bool, device=anchors.device)
        if self.block.get("causal"):
            within = within.tril()
        mask = torch.cat([context_valid[:, None, :].expand(b, size, -1), within.expand(b, size, size)], dim=2)
        for layer, keys, values in zip(self.layers, context_keys, context_values):
            hidden = layer(hidden, keys, values, mask[:, None], cos, sin)
        start = 0 if self.block["sample_from_anchor"] else 1
        return self.norm(hidden[:, start:start + self.draft_length])

    def draft_logits(self, states, previous=None):
        """States # [b, H] -> logits over the target vocabulary # [b, V_target], -inf off the draft
        vocabulary; DSpark adds the Markov bias of the previous token ids # [b] in draft space."""
        logits = self.lm_head(states)  # [b, V_draft]
        if self.markov is not None:
            logits = logits + self.markov.markov_w2(self.markov.markov_w1(previous))
        full = logits.new_full((logits.shape[0], self.target_vocab_size), float("-inf"))
        full[:, torch.arange(logits.shape[1], device=logits.device) + self.d2t] = logits
        return full


class BlockDrafter:
    """The Drafter (methods/base.py) of a batch of rows: per row the context's keys and values,
    one per verified position, fed from the target's states handed at rollback; one head forward
    per step serves every drafting row."""

    def __init__(self, head: BlockDrafterHead, vocab_size: int, rows: list[tuple]):
        """rows: per row a sampling.DraftSampler (or its fields)."""
        self.head, self.vocab_size, self.rows = head, vocab_size, [DraftSampler(*row) for row in rows]
        self.hidden_state_ids = head.aux_layer_ids
        self.context = [None] * len(self.rows)  # per row: per layer (keys, values) # [1, kv, C, d]
        self.pending = [None] * len(self.rows)  # per row: target states # [1, m, A*H] not projected yet
        self.last_forwards = [0] * len(self.rows)

    def rollback(self, valid_lengths: list[int], hidden_states: list | None = None) -> None:
        """The target kept valid_lengths[r] positions; hidden_states[r] # [1, m, A*H] are its
        states of the last m (verified this step): the context grows by them, never shrinks
        (only kept positions' states come back)."""
        if hidden_states is None:
            return
        for r, states in enumerate(hidden_states):
            if states is not None and states.shape[1]:
                self.pending[r] = states if self.pending[r] is None else torch.cat([self.pending[r], states], dim=1)

    def context_length(self, r: int) -> int:
        seen = self.context[r][0][0].shape[2] if self.context[r] is not None else 0
        return seen + (self.pending[r].shape[1] if self.pending[r] is not None else 0)

    def feed(self, r: int) -> None:
        """Project row r's pending target states into its context keys and values."""
        if self.pending[r] is None:
            return
        start = self.context[r][0][0].shape[2] if self.context[r] is not None else 0
        positions = torch.arange(start, start + self.pending[r].shape[1], device=self.pending[r].device).view(1, -1)
        new = self.head.context(self.pending[r], positions)
        self.context[r] = new if self.context[r] is None else [
            (torch.cat([k, nk], dim=2), torch.cat([v, nv], dim=2)) for (k, v), (nk, nv) in zip(self.context[r], new)]
        self.pending[r] = None

    def propose(self, requests):
        """Per row a DraftRequest -> its Proposal: the first request.k of the block's drafts. A row
        whose context does not reach its anchor (before the target's first forward) drafts none."""
        device = requests[0].tokens.device
        self.last_forwards = [0] * len(requests)
        proposals = [Proposal(torch.empty(0, dtype=torch.long, device=device))] * len(requests)
        drafting = [r for r, request in enumerate(requests)
                    if request.k > 0 and self.context_length(r) == request.tokens.shape[1] - 1 > 0]
        if not drafting:
            return proposals
        for r in drafting:
            self.feed(r)
        width = max(self.context[r][0][0].shape[2] for r in drafting)
        valid = torch.zeros(len(drafting), width, dtype=torch.bool, device=device)
        keys, values = [], []
        for layer in range(len(self.head.layers)):
            k_rows, v_rows = [], []
            for row, r in enumerate(drafting):
                k, v = self.context[r][layer]
                pad = width - k.shape[2]
                k_rows.append(torch.nn.functional.pad(k, (0, 0, 0, pad)))
                v_rows.append(torch.nn.functional.pad(v, (0, 0, 0, pad)))
                valid[row, : k.shape[2]] = True
            keys.append(torch.cat(k_rows))
            values.append(torch.cat(v_rows))
        anchors = torch.stack([requests[r].tokens[0, -1] for r in drafting])  # [b]
        anchor_positions = torch.tensor([requests[r].tokens.shape[1] - 1 for r in drafting], device=device)
        states = self.head(anchors, anchor_positions, keys, values, valid)  # [b, D, H]
        drafted = {r: ([], []) for r in drafting}
        previous = anchors
        for index in range(max(requests[r].k for r in drafting)):
            logits = self.head.draft_logits(states[:, index], previous)[:, : self.vocab_size]  # [b, vocab]
            previous = previous.clone()
            for row, r in enumerate(drafting):
                if index >= requests[r].k:  # drawing more would move the row's random stream
                    continue
                token, probs = draft_token(logits[row:row + 1], self.rows[r])  # [1]
                drafted[r][0].append(token)
                if probs is not None:
                    drafted[r][1].append(probs)
                previous[row] = token[0]
        for r, (ids, probs) in drafted.items():
            proposals[r] = Proposal(torch.cat(ids), torch.cat(probs) if probs else None)
            self.last_forwards[r] = 1
        return proposals

    def select(self, rows: list[int]) -> None:
        for name in ("rows", "context", "pending", "last_forwards"):
            setattr(self, name, [getattr(self, name)[r] for r in rows])

    def prefill(self, requests) -> None:
        """Nothing: a row's context is fed from the target states handed at rollback."""

    def extend(self, other: "BlockDrafter") -> None:
        for name in ("rows", "context", "pending", "last_forwards"):
            setattr(self, name, getattr(self, name) + getattr(other, name))


# --- loading, making and saving heads -------------------------------------------------------

def layer_config(config: dict, head) -> Qwen3Config:
    """The draft layers' Qwen3Config from the head's config.json (speculators:
    transformer_layer_config; engine-native: the top level)."""
    fields = dict(config.get("transformer_layer_config") or config)
    for key in ("architectures", "dflash_config", "speculators_config", "auto_map"):
        fields.pop(key, None)
    fields.setdefault("head_dim", fields["hidden_size"] // fields["num_attention_heads"])
    layer = Qwen3Config(**{k: v for k, v in fields.items() if k != "model_type"})
    layer._attn_implementation = "sdpa"
    return layer


def check_runs_here(spec, target_config, name: str) -> None:
    """RuntimeUnsupportedError / RuntimeConfigError in one line for what this runtime cannot run
    exactly; registration (dflash_checkpoint) checked the fit to the target."""
    num_layers = target_config.num_hidden_layers
    if num_layers in spec.aux_layer_ids:
        raise RuntimeUnsupportedError(f"{name}: target layer {num_layers - 1}'s output before the final norm is read "
                                      "by the engines; this runtime reads layer outputs 0..N-2 only")
    if spec.block.get("sliding_window") is not None:
        raise RuntimeUnsupportedError(f"{name}: sliding-window draft layers: this runtime runs full attention only")
    if spec.target_hidden_size != target_config.hidden_size:
        raise RuntimeConfigError(f"{name}: the head reads {spec.target_hidden_size}-wide states, the target's "
                                 f"hidden_size is {target_config.hidden_size}")


def load_block_head(path, target, method: str) -> BlockDrafterHead:
    """A DFlash / DSpark head directory checked against `target` -> BlockDrafterHead in eval mode
    on the target's device and dtype. RuntimeConfigError / ModelReferenceError before any forward."""
    from safetensors.torch import load_file

    from specreg.core.heads import read_head

    path = Path(path)
    spec = read_head(path, method=method)
    check_runs_here(spec, target.config, str(path))
    config = json.loads((path / "config.json").read_text())
    weights = {}
    for file in sorted(path.glob("*.safetensors")):
        weights.update({key.removeprefix("model."): value for key, value in load_file(file).items()})
    if not weights:
        raise ModelReferenceError(f"{path}: no *.safetensors weights (pickle weights are refused)")
    target_vocab = int(target.get_output_embeddings().weight.shape[0])
    own_embed, own_head = "embed_tokens.weight" in weights, "lm_head.weight" in weights
    head = BlockDrafterHead(layer_config(config, spec), spec.block, spec.aux_layer_ids, target.config.hidden_size,
                            spec.draft_vocab_size, target_vocab,
                            embed_tokens=None if own_embed else target.get_input_embeddings(),
                            lm_head=None if own_head else target.get_output_embeddings())
    weights = {key.replace("markov_head.", "markov.", 1): value for key, value in weights.items()
               if not key.startswith(("t2d", "confidence_head.", "verifier_"))}
    weights["d2t"] = weights.get("d2t", torch.zeros(spec.draft_vocab_size, dtype=torch.long)).long()
    shared = {name for name, own in (("embed_tokens.weight", own_embed), ("lm_head.weight", own_head)) if not own}
    expected = set(head.state_dict()) - shared
    missing, unexpected = expected - set(weights), set(weights) - expected
    if missing or unexpected:
        raise RuntimeConfigError(f"{path}: weights do not match the {method} layout: missing {sorted(missing)[:3]}, "
                                 f"unexpected {sorted(unexpected)[:3]}")
    head.load_state_dict(weights, strict=False)
    parameter = next(target.parameters())
    return head.to(device=parameter.device, dtype=parameter.dtype).eval()


def new_block_head(target, *, block_size: int, mask_token_id: int, aux_layer_ids, num_layers: int = 1,
                   markov_rank: int = 0, sample_from_anchor: bool = False, causal: bool = False,
                   seed: int = 0) -> BlockDrafterHead:
    """A freshly initialised head for `target` (its width, the target's embeddings and lm_head
    shared, as vLLM shares them with a checkpoint that has none)."""
    config = target.config
    target_vocab = int(target.get_output_embeddings().weight.shape[0])
    layer = Qwen3Config(hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
                        num_hidden_layers=num_layers, num_attention_heads=config.num_attention_heads,
                        num_key_value_heads=config.num_key_value_heads, head_dim=config.head_dim,
                        rms_norm_eps=config.rms_norm_eps, vocab_size=target_vocab,
                        max_position_embeddings=config.max_position_embeddings,
                        rope_parameters=dict(config.rope_parameters), tie_word_embeddings=False)
    layer._attn_implementation = "sdpa"
    block = {"block_size": block_size, "draft_length": block_size if sample_from_anchor else block_size - 1,
             "sample_from_anchor": sample_from_anchor, "mask_token_id": mask_token_id, "causal": causal}
    if markov_rank:
        block.update(markov_rank=markov_rank, markov_head_type="vanilla")
    torch.manual_seed(seed)
    head = BlockDrafterHead(layer, block, tuple(sorted(aux_layer_ids)), config.hidden_size, target_vocab,
                            target_vocab, embed_tokens=target.get_input_embeddings(),
                            lm_head=target.get_output_embeddings())
    parameter = next(target.parameters())
    return head.to(device=parameter.device, dtype=parameter.dtype)


def save_block_head(head: BlockDrafterHead, directory, kind: str, verifier_name_or_path: str,
                    verifier_architectures=(), layout: str = "speculators") -> Path:
    """Write `head` in the speculators layout, or with layout="native" a DFlash head in the
    engine-native one z-lab and ModelOpt write (DFlashDraftModel, dflash_config with
    target_layer_ids one less than the aux ids: layer outputs), which llama.cpp's converter
    reads. config.json + model.safetensors; the target's embeddings and lm_head are not saved
    (the engines share them when absent), nor an identity d2t over the target's whole vocabulary
    (vLLM's DFlash and DSpark loaders then have no parameter for it and raise)."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    identity = not head.d2t.any() and (layout == "native" or int(head.d2t.shape[0]) == int(head.config.vocab_size))
    skipped = ("embed_tokens.weight", "lm_head.weight") + (("d2t",) if identity else ())
    state = {key.replace("markov.", "markov_head.", 1): value.detach().contiguous().cpu()
             for key, value in head.state_dict().items() if key not in skipped and not key.startswith("rotary_emb")}
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    layer = head.config.to_dict()
    for key in ("_attn_implementation", "_attn_implementation_internal", "architectures", "dtype", "torch_dtype",
                "transformers_version", "output_attentions", "output_hidden_states", "return_dict"):
        layer.pop(key, None)
    layer["model_type"] = "qwen3"
    block = head.block
    config = {
        "architectures": ["DFlashSpeculator" if kind == "dflash" else "DSparkSpeculator"],
        "speculators_model_type": kind, "transformer_layer_config": layer,
        "draft_vocab_size": int(head.d2t.shape[0]), "target_hidden_size": None, "block_size": block["block_size"],
        "aux_hidden_state_layer_ids": list(head.aux_layer_ids), "mask_token_id": block["mask_token_id"],
        "sliding_window_non_causal": not block.get("causal"), "sample_from_anchor": block["sample_from_anchor"],
        "speculators_config": {
            "algorithm": kind, "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": block["draft_length"]}],
            "verifier": {"name_or_path": str(verifier_name_or_path), "architectures": list(verifier_architectures)},
        },
    }
    if block.get("markov_rank"):
        config.update(markov_rank=block["markov_rank"], markov_head_type="vanilla", enable_confidence_head=False)
    if layout == "native":
        config = {"architectures": ["DFlashDraftModel"], **layer, "block_size": block["block_size"],
                  "dflash_config": {"mask_token_id": block["mask_token_id"], "causal": bool(block.get("causal")),
                                    "target_layer_ids": [i - 1 for i in head.aux_layer_ids]}}
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return directory


def loader(method: str):
    def load(target_path, draft_path, device, dtype, *, target_fingerprint=None, draft_fingerprint=None):
        """The target and the block drafter in draft_path, checked against it before any forward."""
        from specreg.runtime.loading import load_target
        from specreg.runtime.pair import ModelPair, output_vocab_size

        tokenizer, target = load_target(target_path, device, dtype, target_fingerprint)
        if draft_path is None:
            raise RuntimeConfigError(f"method {method!r} needs the head's directory")
        return ModelPair(target=target, tokenizer=tokenizer, draft=load_block_head(draft_path, target, method),
                         vocab_size=output_vocab_size(target))
    return load


def block_drafter(pair, configs, generators):
    """One BlockDrafter for the batch: each block forward serves every row."""
    if not isinstance(pair.draft, BlockDrafterHead):
        raise RuntimeConfigError("a block drafter method needs a DFlash / DSpark head (load_pair(..., method=...))")
    for config in configs:
        if config.k > pair.draft.draft_length:
            raise RuntimeConfigError(f"k {config.k} exceeds the head's {pair.draft.draft_length} drafts a block")
    return BlockDrafter(pair.draft, pair.vocab_size, [DraftSampler.of(c, generator)
                                                      for c, generator in zip(configs, generators)])


METHOD = Method(name="dflash", load=loader("dflash"), drafter=block_drafter)

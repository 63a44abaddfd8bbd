"""Medusa heads: several small heads on the target's last hidden state, head i proposing the
token i + 2 places ahead; their top-k candidates are laid into a tree and verified in one target
forward (tree.py).

What we followed (read 2026-12-01):
- FasterDecoding/Medusa medusa/model/medusa_model.py: MedusaConfig (medusa_num_heads,
  medusa_num_layers, base_model_name_or_path); head i = medusa_num_layers ResBlocks, each
  x + SiLU(Linear(x)) with a bias, then Linear(hidden, vocab, bias=False); at initialisation the
  ResBlock weights are zero and every head's output layer is a copy of the base lm_head; the heads
  read `base_model.model(...)[0]`, the decoder's final normed hidden state.
- FasterDecoding/Medusa medusa/model/utils.py: generate_candidates (the root is the base model's
  next token, head i's top-k fill depth i+1: a node's token is its depth's proposal at its last
  rank), tree_decoding, evaluate_posterior (greedy: longest matching path).
- huggingface/text-generation-inference server/text_generation_server/layers/medusa.py:
  medusa_lm_head.safetensors with head i's ResBlock j at `{i}.{j}.linear.{weight,bias}` and its
  output layer at `{i}.{medusa_num_layers}.weight` (MedusaHeadV1; V2, the fallback, shares the
  base lm_head instead). specreg.core.heads reads exactly that layout (and a `medusa_head.` prefix).

Use: load_medusa_heads(dir, target) -> MedusaHeads; MedusaDrafter(heads, tree) proposes a tree
from the hidden state tree_forward returns; tree_generate is the decode loop (the lead folds it
into decode.stream_generate, see the README of issue 11's report).

This module imports torch at import time (its classes are nn.Modules): import it lazily.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from specreg.errors import ModelReferenceError, RuntimeConfigError
from specreg.runtime.acceptance import tree_greedy_accept, tree_rejection_sample
from specreg.runtime.metrics import GenerationMetrics
from specreg.runtime.sampling import logits_to_probs, sample
from specreg.runtime.tree import CandidateTree, compact_cache, parse_tree, tree_candidates, tree_forward

WEIGHTS_FILE = "medusa_lm_head.safetensors"


class ResBlock(torch.nn.Module):
    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = torch.nn.Linear(hidden_size, hidden_size)
        self.act = torch.nn.SiLU()

    def forward(self, x):
        return x + self.act(self.linear(x))


class MedusaHeads(torch.nn.Module):
    """heads[i] = Sequential(ResBlock * num_layers, Linear(hidden, vocab)); state_dict names
    `heads.{i}.{j}.linear.*` / `heads.{i}.{num_layers}.weight` are the file's names under `heads.`."""

    def __init__(self, num_heads: int, num_layers: int, hidden_size: int, vocab_size: int):
        super().__init__()
        self.num_heads, self.num_layers = num_heads, num_layers
        self.heads = torch.nn.ModuleList(
            torch.nn.Sequential(*[ResBlock(hidden_size) for _ in range(num_layers)],
                                torch.nn.Linear(hidden_size, vocab_size, bias=False))
            for _ in range(num_heads))

    def forward(self, hidden):
        """hidden # [..., H] the target's final normed states -> logits # [num_heads, ..., vocab]."""
        return torch.stack([head(hidden) for head in self.heads])


def new_medusa_heads(target, num_heads: int, num_layers: int = 1, seed: int = 0) -> MedusaHeads:
    """Heads initialised as Medusa does: ResBlocks zero (bias as nn.Linear draws it, so SiLU(b) is
    added), each output layer a copy of the target's lm_head; on the target's device and dtype."""
    if num_heads < 1 or num_layers < 0:
        raise RuntimeConfigError(f"medusa_num_heads = {num_heads}, medusa_num_layers = {num_layers}: need heads >= 1, "
                                 "layers >= 0")
    torch.manual_seed(seed)
    lm_head = target.get_output_embeddings().weight  # [vocab, H]
    heads = MedusaHeads(num_heads, num_layers, lm_head.shape[1], lm_head.shape[0])
    with torch.no_grad():
        for head in heads.heads:
            for block in head[:-1]:
                block.linear.weight.zero_()
            head[-1].weight.copy_(lm_head.detach().cpu())
    return heads.to(device=lm_head.device, dtype=lm_head.dtype)


def save_medusa_heads(heads: MedusaHeads, directory, base_model_name_or_path: str | None = None) -> Path:
    """Write a Medusa head directory: config.json + medusa_lm_head.safetensors (TGI's names)."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {name: tensor.detach().contiguous().cpu() for name, tensor in heads.heads.state_dict().items()}
    save_file(state, str(directory / WEIGHTS_FILE), metadata={"format": "pt"})
    config = {"medusa_num_heads": heads.num_heads, "medusa_num_layers": heads.num_layers}
    if base_model_name_or_path is not None:
        config["base_model_name_or_path"] = str(base_model_name_or_path)
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return directory


def build_medusa_heads(target, directory, num_heads: int, num_layers: int = 1, *, base_model_name_or_path=None,
                       seed: int = 0) -> Path:
    """Untrained Medusa heads for `target`, saved as a head directory -> the directory."""
    return save_medusa_heads(new_medusa_heads(target, num_heads, num_layers, seed), directory,
                             base_model_name_or_path)


def load_medusa_heads(path, target) -> MedusaHeads:
    """A Medusa head directory (config.json + *.safetensors, read by specreg.core.heads) checked
    against `target` -> MedusaHeads in eval mode on the target's device and dtype.

    RuntimeConfigError when the heads do not fit the target (hidden size, vocabulary); the
    reader's ModelReferenceError when the directory is not Medusa heads. No pickle is read.
    """
    from safetensors.torch import load_file

    from specreg.core.heads import read_head

    spec = read_head(path, method="medusa")
    lm_head = target.get_output_embeddings().weight  # [vocab, H]
    if spec.hidden_size != lm_head.shape[1]:
        raise RuntimeConfigError(f"{path}: Medusa heads for hidden size {spec.hidden_size}, the target's is "
                                 f"{lm_head.shape[1]}")
    if spec.draft_vocab_size != lm_head.shape[0]:
        raise RuntimeConfigError(f"{path}: Medusa heads over {spec.draft_vocab_size} tokens, the target's "
                                 f"vocabulary has {lm_head.shape[0]}")
    weights = {}
    for file in spec.weight_files:
        for name, tensor in load_file(str(Path(path) / file)).items():
            weights[name.removeprefix("medusa_head.")] = tensor
    heads = MedusaHeads(spec.num_heads, spec.num_layers, spec.hidden_size, spec.draft_vocab_size)
    # tensors of heads beyond medusa_num_heads are left out, as TGI loads only the heads it uses
    missing, _ = heads.heads.load_state_dict(weights, strict=False)
    if missing:  # read_head checked the names already: this is a reader/loader disagreement
        raise ModelReferenceError(f"{path}: Medusa weights lack {sorted(missing)[:3]}")
    return heads.to(device=lm_head.device, dtype=lm_head.dtype).eval()


class MedusaDrafter:
    """Proposes a candidate tree from the hidden state of the last verified position.

    propose(root_token_id, hidden) -> (node_token_ids # [nodes+1], draft_probs # [nodes+1, vocab] or
    None when greedy). Candidates are each head's top-`tree.width` tokens, deterministic, so in
    sampling mode each node's draft law is a point mass on its token (the tree rule is then
    EAGLE's: exact for any target law).
    """

    def __init__(self, heads: MedusaHeads, tree: CandidateTree, vocab_size: int, sampling: bool = False):
        if tree.depth > heads.num_heads:
            raise RuntimeConfigError(f"tree depth {tree.depth} exceeds the {heads.num_heads} Medusa heads "
                                     f"(head i proposes depth i + 1)")
        self.heads, self.tree, self.vocab_size, self.sampling = heads, tree, vocab_size, sampling
        self.forwards = 0

    def propose(self, root_token_id, hidden, tree: CandidateTree | None = None):
        tree = tree or self.tree
        logits = self.heads(hidden)[: tree.depth, : self.vocab_size]  # [depth, vocab]
        self.forwards += 1
        proposals = torch.topk(logits, tree.width, dim=-1).indices  # [depth, width]
        node_token_ids = tree_candidates(root_token_id, proposals, tree)  # [nodes+1]
        if not self.sampling:
            return node_token_ids, None
        draft_probs = torch.nn.functional.one_hot(node_token_ids, self.vocab_size).to(logits.dtype)  # [nodes+1, vocab]
        return node_token_ids, draft_probs


def tree_generate(target, medusa_heads: MedusaHeads, tree, prompt_ids, max_new_tokens: int, *,
                  temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
                  eos_token_ids=(), seed: int = 0, vocab_size: int | None = None):
    """Medusa tree decoding of one prompt -> decode.Generation(token_ids, text=None, metrics).

    tree: a CandidateTree or its paths. prompt_ids: list[int] or a tensor # [n] / [1, n].
    temperature 0 is greedy (token-identical to target-only greedy); > 0 samples with the tree
    rule, seeded by `seed`. The first forward is the prefill (no hidden state to draft from yet);
    each later one verifies a tree. Metrics as for draft models, with position = depth: drafted
    counts the tree's depth per step (the positions speculated), accepted the kept path's length.
    Raises RuntimeConfigError before any forward for a tree deeper than the heads or bad settings.
    """
    from transformers import DynamicCache

    from specreg.runtime.decode import Generation

    tree = tree if isinstance(tree, CandidateTree) else parse_tree(tree)
    vocab_size = vocab_size or int(target.get_output_embeddings().weight.shape[0])
    sampling = temperature > 0
    drafter = MedusaDrafter(medusa_heads, tree, vocab_size, sampling)
    if max_new_tokens < 1 or temperature < 0:
        raise RuntimeConfigError(f"max_new_tokens = {max_new_tokens}, temperature = {temperature}: need >= 1, >= 0")
    device = next(target.parameters()).device
    prompt = torch.as_tensor(prompt_ids, dtype=torch.long, device=device).view(1, -1)  # [1, n]
    if prompt.shape[1] == 0:
        raise RuntimeConfigError("empty prompt: at least one token is needed")
    max_length = prompt.shape[1] + max_new_tokens
    limit = getattr(target.config, "max_position_embeddings", None)
    if limit is not None:
        if prompt.shape[1] > limit:
            raise RuntimeConfigError(f"prompt of {prompt.shape[1]} tokens is longer than the target's "
                                     f"max_position_embeddings {limit}")
        max_length = min(max_length, limit)
    generator = torch.Generator(device=device).manual_seed(seed) if sampling else None
    eos_ids = set(eos_token_ids or ())
    metrics = GenerationMetrics(prompt_tokens=prompt.shape[1])
    cache = DynamicCache(config=target.config)
    generated: list[int] = []
    pending, hidden, length = prompt, None, prompt.shape[1]  # tokens the cache lacks; last state; sequence length
    start = time.perf_counter()
    with torch.inference_mode():
        while True:
            step_start = time.perf_counter()
            root = pending[0, -1:]  # [1]
            # the tree, cut to what the budget can still take after the bonus token
            step_tree = tree.pruned(max_length - length - 1) if hidden is not None and max_length - length > 1 else None
            if step_tree is not None:
                node_token_ids, draft_probs = drafter.propose(root, hidden, step_tree)
                metrics.draft_forwards += 1
            else:
                node_token_ids, draft_probs = root, None
            verify_start = time.perf_counter()
            metrics.draft_time_s += verify_start - step_start
            keep_length = cache.get_seq_length() + pending.shape[1]  # the prefix and the root
            logits, states = tree_forward(target, cache, pending, node_token_ids, step_tree)
            logits = logits[:, :vocab_size]  # [nodes+1, vocab]
            if step_tree is None:
                target_probs = logits_to_probs(logits, temperature, top_k, top_p) if sampling else None
                accepted = torch.empty(0, dtype=torch.long, device=device)
                emitted = sample(target_probs, generator) if sampling else logits.argmax(dim=-1)  # [1]
            elif sampling:
                target_probs = logits_to_probs(logits, temperature, top_k, top_p)  # [nodes+1, vocab]
                uniforms = torch.rand(node_token_ids.shape[0], generator=generator, device=device)
                accepted, emitted = tree_rejection_sample(draft_probs, target_probs, node_token_ids,
                                                          step_tree.buffers(device).parent_ids, uniforms, generator)
            else:
                accepted, emitted = tree_greedy_accept(node_token_ids, logits.argmax(dim=-1),
                                                       step_tree.buffers(device).retrieve_indices)
            if step_tree is not None:
                compact_cache(cache, keep_length, accepted)
            hidden = states[int(accepted[-1]) if accepted.numel() else 0]  # [H] where the emitted token was predicted
            emitted_list = emitted.tolist()
            now = time.perf_counter()
            metrics.verify_time_s += now - verify_start
            metrics.record_step(step_tree.depth if step_tree is not None else 0, len(emitted_list) - 1,
                                len(emitted_list))
            first_step = metrics.ttft_s is None
            if first_step:
                metrics.ttft_s = now - start
            stop = None
            for token in emitted_list:
                generated.append(token)
                metrics.generated_tokens += 1
                metrics.ttft_tokens += first_step
                metrics.token_latencies_s.append((now - step_start) / len(emitted_list))
                length += 1
                if token in eos_ids:
                    stop = "eos"
                elif length >= max_length:
                    stop = "max_new_tokens" if len(generated) >= max_new_tokens else "max_position"
                if stop:
                    break
            if stop:
                metrics.stop_reason = stop
                break
            pending = emitted[-1:].view(1, 1)  # the bonus/recovered token: the next tree's root
    metrics.total_time_s = time.perf_counter() - start
    return Generation(token_ids=generated, text=None, metrics=metrics)

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

Use: METHOD.load (load_pair(target, heads, method="medusa")) loads MedusaHeads (load_medusa_heads)
and decode.stream_generate with DecodeConfig(method="medusa", tree=...) drafts with MedusaDrafter
(METHOD.drafter) and verifies each tree in one target forward.

This module imports torch at import time (its classes are nn.Modules): import it lazily.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from specreg.errors import ModelReferenceError, RuntimeConfigError
from specreg.runtime.methods.base import Method, PerRowDrafter, Proposal
from specreg.runtime.tree import CandidateTree, tree_candidates

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
    """Proposes a candidate tree from the target's final normed state at the last verified position.

    propose_tree(tokens, tree) -> (node_token_ids # [nodes+1] root first, draft_probs # [nodes+1, vocab] or
    None when greedy); empty before the target has run once (no hidden state yet). Candidates are
    each head's top-`tree.width` tokens, deterministic, so in sampling mode each node's draft law is
    a point mass on its token (the tree rule is then EAGLE's: exact for any target law).
    rollback(valid_length, hidden_states # [1, m, H]) keeps the last kept position's state.
    """

    def __init__(self, heads: MedusaHeads, tree: CandidateTree, vocab_size: int, final_state_id: int,
                 sampling: bool = False):
        if tree.depth > heads.num_heads:
            raise RuntimeConfigError(f"tree depth {tree.depth} exceeds the {heads.num_heads} Medusa heads "
                                     f"(head i proposes depth i + 1)")
        self.heads, self.vocab_size, self.sampling = heads, vocab_size, sampling
        self.hidden_state_ids = (final_state_id,)  # the decoder's final normed state (forward_logits' index)
        self.hidden = None  # [H] the state where the next root token was predicted
        self.forwards = 0

    def propose(self, request) -> Proposal:
        """A methods.base.DraftRequest (its tree) -> the tree's node tokens and draft law."""
        return Proposal(*self.propose_tree(request.tokens, request.tree))

    def propose_tree(self, tokens, tree: CandidateTree):
        if self.hidden is None:
            return torch.empty(0, dtype=torch.long, device=tokens.device), None
        logits = self.heads(self.hidden)[: tree.depth, : self.vocab_size]  # [depth, vocab]
        self.forwards += 1
        proposals = torch.topk(logits, tree.width, dim=-1).indices  # [depth, width]
        node_token_ids = tree_candidates(tokens[0, -1:], proposals, tree)  # [nodes+1]
        if not self.sampling:
            return node_token_ids, None
        draft_probs = torch.nn.functional.one_hot(node_token_ids, self.vocab_size).to(logits.dtype)  # [nodes+1, vocab]
        return node_token_ids, draft_probs

    def rollback(self, valid_length: int, hidden_states=None) -> None:
        """hidden_states # [1, m, H]: the target's states at the positions kept this step; the last
        one predicted the token emitted last, the next tree's root."""
        if hidden_states is not None and hidden_states.shape[1] > 0:
            self.hidden = hidden_states[0, -1]


def load(target_path, draft_path, device, dtype, *, target_fingerprint=None, draft_fingerprint=None):
    """The target and the Medusa heads in draft_path, checked against it -> ModelPair."""
    from specreg.runtime.loading import load_target
    from specreg.runtime.pair import ModelPair, output_vocab_size

    tokenizer, target = load_target(target_path, device, dtype, target_fingerprint)
    if draft_path is None:
        raise RuntimeConfigError("method 'medusa' needs the Medusa heads' directory")
    return ModelPair(target=target, tokenizer=tokenizer, draft=load_medusa_heads(draft_path, target),
                     vocab_size=output_vocab_size(target))


def drafter(pair, configs, generators):
    """One MedusaDrafter per row, reading the target's final normed state."""
    if not isinstance(pair.draft, MedusaHeads):
        raise RuntimeConfigError("method 'medusa' needs Medusa heads (load_pair(..., method='medusa'))")
    final_state_id = pair.target.config.num_hidden_layers
    return PerRowDrafter([MedusaDrafter(pair.draft, c.tree, pair.vocab_size, final_state_id,
                                        c.temperature > 0) for c in configs], (final_state_id,))


METHOD = Method(name="medusa", load=load, drafter=drafter)

"""Medusa heads: several small heads on the target's last hidden state, head i proposing the
token i + 2 places ahead; their top-k candidates are laid into a tree and verified in one target
forward (tree.py).

What we followed:
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
and generate.stream_generate with DecodeConfig(method="medusa", tree=...) drafts with MedusaDrafter
(METHOD.drafter) and verifies each tree in one target forward.

This module imports torch at import time (its classes are nn.Modules): import it lazily.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from specreg.errors import ModelReferenceError, RuntimeConfigError
from specreg.runtime.methods.base import Method, Proposal
from specreg.runtime.tree import tree_candidates

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
    """Proposes each row's candidate tree from the target's final normed state at its last verified
    position: one pass of the heads over every drafting row's state per step.

    Candidates are each head's top-`tree.width` tokens, deterministic, so in sampling mode each
    node's draft law is a point mass on its token (the tree rule is then EAGLE's: exact for any
    target law). rollback(valid_lengths, hidden_states) keeps each row's last kept position's state.
    """

    def __init__(self, heads: MedusaHeads, vocab_size: int, final_state_id: int, sampling: list[bool]):
        self.heads, self.vocab_size = heads, vocab_size
        self.sampling = list(sampling)  # per row
        self.hidden_state_ids = (final_state_id,)  # the decoder's final normed state (forward_logits' index)
        self.hidden = [None] * len(self.sampling)  # per row [H]: the state where its next root token was predicted
        self.last_forwards = [0] * len(self.sampling)

    def propose(self, requests) -> list[Proposal]:
        """Per row a methods.base.DraftRequest (its tree) -> the tree's node tokens # [nodes+1] root
        first and draft law # [nodes+1, vocab] (None when greedy); none for a row asked for none or
        before the target has run once (no hidden state yet)."""
        device = requests[0].tokens.device
        rows = [r for r, request in enumerate(requests) if request.k > 0 and self.hidden[r] is not None]
        self.last_forwards = [int(r in rows) for r in range(len(requests))]
        proposals = [Proposal(torch.empty(0, dtype=torch.long, device=device))] * len(requests)
        if not rows:
            return proposals
        depth = max(requests[r].tree.depth for r in rows)
        logits = self.heads(torch.stack([self.hidden[r] for r in rows]))[:depth, :, : self.vocab_size]  # [depth, rows, vocab]
        for index, r in enumerate(rows):
            tree = requests[r].tree
            ranked = torch.topk(logits[: tree.depth, index], tree.width, dim=-1).indices  # [depth, width]
            node_token_ids = tree_candidates(requests[r].tokens[0, -1:], ranked, tree)  # [nodes+1]
            draft_probs = (torch.nn.functional.one_hot(node_token_ids, self.vocab_size).to(logits.dtype)
                           if self.sampling[r] else None)  # [nodes+1, vocab]
            proposals[r] = Proposal(node_token_ids, draft_probs)
        return proposals

    def rollback(self, valid_lengths: list[int], hidden_states: list | None = None) -> None:
        """hidden_states[r] # [1, m, H]: the target's states at the positions row r kept this step;
        the last one predicted the token emitted last, the next tree's root."""
        for r, states in enumerate(hidden_states or []):
            if states is not None and states.shape[1] > 0:
                self.hidden[r] = states[0, -1]

    def select(self, rows: list[int]) -> None:
        self.sampling = [self.sampling[r] for r in rows]
        self.hidden = [self.hidden[r] for r in rows]
        self.last_forwards = [self.last_forwards[r] for r in rows]

    def prefill(self, requests) -> None:
        """Nothing: a row's state comes with its first rollback."""

    def extend(self, other: "MedusaDrafter") -> None:
        self.sampling += other.sampling
        self.hidden += other.hidden
        self.last_forwards += other.last_forwards


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
    """One MedusaDrafter for the batch, reading the target's final normed state."""
    if not isinstance(pair.draft, MedusaHeads):
        raise RuntimeConfigError("method 'medusa' needs Medusa heads (load_pair(..., method='medusa'))")
    for c in configs:
        if c.tree.depth > pair.draft.num_heads:
            raise RuntimeConfigError(f"tree depth {c.tree.depth} exceeds the {pair.draft.num_heads} Medusa heads "
                                     f"(head i proposes depth i + 1)")
    return MedusaDrafter(pair.draft, pair.vocab_size, pair.target.config.num_hidden_layers,
                         [c.temperature > 0 for c in configs])

METHOD = Method(name="medusa", load=load, drafter=drafter)

"""The one shape every drafting method has: what the decode loop asks of it and nothing else.

A method is one module runtime/methods/<name>.py, named as the registry names the method
(specreg.core.methods), that defines METHOD, a DraftingMethod:

    name                                  the method's registry name
    load(target_path, draft_path, device, dtype, *, target_fingerprint=None,
         draft_fingerprint=None) -> ModelPair
                                          loads the target and what drafts for it, checked
                                          before any forward (RuntimeConfigError)
    check(config) -> None                 the method's own rules on a DecodeConfig
    session(config) -> object | None      what one server keeps across the requests it serves
                                          (DecodeConfig.session; None for a method whose drafts
                                          depend on their own request alone)
    drafter(pair, configs, generators) -> Drafter
                                          the drafter of one batch: per row its DecodeConfig and
                                          random generator (None when greedy)

A Drafter drafts for the rows of one batch, in the order the loop lists them:

    hidden_state_ids: tuple[int, ...]     the target states it reads (forward.forward_logits'
                                          indices; () for none)
    last_forwards: list[int]              per row, the drafter forwards the last propose took
    propose(requests) -> list[Proposal]   one DraftRequest per row; k == 0: draft nothing
    rollback(valid_lengths, hidden_states)
                                          per row, the verified length kept, and (when
                                          hidden_state_ids) the target states # [1, m, A*H] of
                                          the m positions verified this step, else None
    select(rows)                          keep only these rows (the others finished)
    prefill(requests)                     make the rows' state ready to draft from their verified
                                          tokens without drafting (rows about to join a batch)
    extend(other)                         append the rows of another drafter of the same method
                                          (rows admitted into the batch, after their first step)

A model-free method (n-gram, suffix: a lookup per row, no forward to share) writes a RowDrafter
(propose(request) -> Proposal, rollback(valid_length, hidden_states=None), forwards) and batches
it with PerRowDrafter; a method with a model batches its rows itself, one forward serving them
all (draft_model.DraftModelDrafter, head_drafter.HeadDrafter, medusa.MedusaDrafter). A
Proposal may hold fewer than k drafts (none: nothing to propose this step).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol


@dataclass(frozen=True)
class DraftRequest:
    """What a row drafts from: the verified sequence, as a tensor and as ints, the drafts wanted
    and, for a tree method, the candidate tree of this step (pruned near the budget)."""

    tokens: Any  # [1, n] long
    token_list: list[int]  # the same n tokens
    k: int  # drafts wanted (0: none); a tree's depth
    tree: Any = None  # runtime.tree.CandidateTree or None for a chain


class Proposal(NamedTuple):
    """A row's drafts: a chain draft_token_ids # [<=k], or a tree's node tokens # [nodes+1] root
    first; draft_probs # [same, vocab] the draft law q, or None when greedy."""

    draft_token_ids: Any
    draft_probs: Any = None


def point_mass_proposal(token_ids: list[int], vocab_size: int, sampling: bool, device) -> Proposal:
    """A model-free method's looked-up continuation -> its Proposal: draft_token_ids # [<=k] and,
    when sampling, draft_probs # [<=k, vocab] point masses (q is 1 on the looked-up token)."""
    import torch

    draft_ids = torch.tensor(token_ids, dtype=torch.long, device=device)  # [<=k]
    if not sampling:
        return Proposal(draft_ids)
    draft_probs = torch.zeros(len(token_ids), vocab_size, device=device)
    draft_probs[torch.arange(len(token_ids)), draft_ids] = 1.0  # point mass q
    return Proposal(draft_ids, draft_probs)


class Drafter(Protocol):
    hidden_state_ids: tuple[int, ...]
    last_forwards: list[int]

    def propose(self, requests: list[DraftRequest]) -> list[Proposal]: ...

    def rollback(self, valid_lengths: list[int], hidden_states: list | None = None) -> None: ...

    def select(self, rows: list[int]) -> None: ...

    def prefill(self, requests: list[DraftRequest]) -> None: ...

    def extend(self, other: "Drafter") -> None: ...


class RowDrafter(Protocol):
    forwards: int  # forwards run so far (0 for a model-free method)

    def propose(self, request: DraftRequest) -> Proposal: ...

    def rollback(self, valid_length: int, hidden_states=None) -> None: ...


class DraftingMethod(Protocol):
    name: str

    def load(self, target_path, draft_path, device, dtype, *, target_fingerprint=None,
             draft_fingerprint=None): ...

    def check(self, config) -> None: ...

    def drafter(self, pair, configs: list, generators: list) -> Drafter: ...


class PerRowDrafter:
    """A Drafter over one RowDrafter per row, asked row by row: a model-free lookup has no forward
    that rows could share."""

    def __init__(self, drafters: list, hidden_state_ids: tuple[int, ...] = ()):
        self.drafters = drafters
        self.hidden_state_ids = tuple(hidden_state_ids)
        self.last_forwards = [0] * len(drafters)

    def propose(self, requests: list[DraftRequest]) -> list[Proposal]:
        proposals = []
        for r, (drafter, request) in enumerate(zip(self.drafters, requests)):
            before = drafter.forwards
            proposals.append(drafter.propose(request) if request.k > 0 else Proposal(None))
            self.last_forwards[r] = drafter.forwards - before
        return proposals

    def rollback(self, valid_lengths: list[int], hidden_states: list | None = None) -> None:
        for r, drafter in enumerate(self.drafters):
            drafter.rollback(valid_lengths[r], hidden_states[r] if hidden_states is not None else None)

    def select(self, rows: list[int]) -> None:
        self.drafters = [self.drafters[r] for r in rows]
        self.last_forwards = [self.last_forwards[r] for r in rows]

    def prefill(self, requests: list[DraftRequest]) -> None:
        """Nothing: a row's own drafter reads its state as it goes (a head the target states
        handed at rollback, a lookup the tokens), none is shared with other rows."""

    def finish(self, rows: list[int], sampled: list[list[int]]) -> None:
        """These rows ended; per row its sequence with every token its last step sampled (past
        its budget or a stop token too), for a row drafter that keeps them for later requests
        (suffix.SuffixDrafter.finish)."""
        for r, sequence in zip(rows, sampled):
            finish = getattr(self.drafters[r], "finish", None)
            if finish is not None:
                finish(sequence)

    def extend(self, other: "PerRowDrafter") -> None:
        self.drafters += other.drafters
        self.last_forwards += other.last_forwards


@dataclass(frozen=True)
class Method:
    """A DraftingMethod from its three functions (a method module's METHOD)."""

    name: str
    load: Any  # (target_path, draft_path, device, dtype, *, target_fingerprint, draft_fingerprint) -> ModelPair
    drafter: Any  # (pair, configs, generators) -> Drafter
    check: Any = lambda config: None  # (DecodeConfig) -> None, RuntimeConfigError
    session: Any = None  # (DecodeConfig) -> what one server keeps across requests; None: nothing

"""The suffix method (suffix decoding, vLLM `method: suffix`): no model; drafts are the likeliest
continuation of the sequence's last tokens in suffix trees of the request's own tokens.

vLLM 0.33.0 serves it through Arctic Inference's cache (vllm/v1/spec_decode/suffix_decoding.py,
SuffixDecodingProposer, calling arctic_inference.suffix_decoding.SuffixDecodingCache, whose tree
is C++: csrc/suffix_decoding/suffix_tree.cc). Each step, per request, vLLM:

1. on the request's first draft step, builds a *prompt tree* over the prompt (start_request);
2. appends the tokens sampled this step to the prompt tree and to the *global tree* of responses
   (add_active_response; the global tree is off when suffix_decoding_max_cached_requests is 0);
3. asks both trees for a draft from the last max_tree_depth tokens (speculate) and keeps the one
   with the higher score, the prompt tree's on a tie.

A tree holds every substring of at most max_tree_depth tokens of its sequences, each node
counting the suffixes that pass through or end at it, children ordered by count. A tree's draft
(SuffixTree::speculate): for each match length m = 1 .. len(context) - 1 while the last m tokens
are in the tree, follow the most counted child from the matched node, each token's probability the
product of count(child) / count(parent) along the way, while fewer than min(k, m *
max_spec_factor + max_spec_offset) tokens are drafted and the probability stays >= min_token_prob;
the score is the sum of the drafted tokens' probabilities, and the best score wins, the longer
match on a tie. Children of equal count keep the order the C++ sibling list gives them (a child
whose count grows moves before the run of siblings its count used to equal, _increment_count);
arithmetic is float32 as in C++.

The global tree is the server's, not the request's: it holds the responses of every request
the server served (the last max_cached_requests, evicted first in, first out:
arctic_inference/suffix_decoding/cache.py _maybe_evict_requests), so a request drafts from the
responses that came before it. SuffixCache is that tree; the drafters of one decode share one
when their configs carry it (DecodeConfig.session, made by METHOD.session), and the requests
decoded one after another in order are vLLM at concurrency 1 serving them in that order. Without
one, each request is a fresh server's first. tests/engines/test_suffix_proposer.py runs vLLM's
proposer with Arctic Inference built from its source on the same sequences, one request at a time
and as a series on one proposer, and requires the same draft tokens.

The draft distribution is a point mass on each proposed token (vLLM passes no draft probabilities
for it), so sampling accepts x with probability p(x).
"""

from __future__ import annotations

from collections import deque

from specreg.core.suffix_settings import SuffixSettings
from specreg.runtime.methods.base import DraftRequest, Method, PerRowDrafter, Proposal, point_mass_proposal
from specreg.runtime.methods.ngram import load as ngram_load

class _Node:
    __slots__ = ("token", "count", "children", "order")

    def __init__(self, token: int = -1):
        self.token = token
        self.count = 0
        self.children: dict[int, _Node] = {}
        self.order: list[_Node] = []  # children by decreasing count, ties as the C++ sibling list has them


def _increment(parent: _Node, child: _Node) -> None:
    """child.count += 1, moved in parent.order as suffix_tree.cc _increment_count moves it."""
    order = parent.order
    index = order.index(child)
    if index == 0 or order[index - 1].count > child.count + 1:
        child.count += 1
        return
    # before the head of the previous sibling's run of equal counts (its group)
    head, run_count = index - 1, order[index - 1].count
    while head > 0 and order[head - 1].count == run_count:
        head -= 1
    del order[index]
    child.count += 1
    order.insert(head, child)


def _decrement(parent: _Node, child: _Node) -> None:
    """child.count -= 1 (it stays above 0), moved in parent.order as suffix_tree.cc _decrement_count
    moves it: behind the rest of its run of equal counts, before the siblings of lower count."""
    order = parent.order
    order.remove(child)
    position = next((i for i, sibling in enumerate(order) if sibling.count < child.count), len(order))
    child.count -= 1
    order.insert(position, child)


class SuffixTree:
    """Arctic Inference's SuffixTree, uncompressed (its path compression changes neither counts nor
    order): append tokens to one of its sequences, remove a sequence, draft from a context."""

    def __init__(self, max_depth: int):
        self.max_depth = max_depth
        self.root = _Node()
        # per sequence: nodes where the suffixes of its last max_depth starts end
        self.active: dict[int, deque[_Node]] = {}

    def append(self, token: int, sequence: int = 0) -> None:
        active = self.active.setdefault(sequence, deque())
        active.append(self.root)
        self.root.count += 1
        if len(active) > self.max_depth:
            active.popleft()
        for index, node in enumerate(active):
            child = node.children.get(token)
            if child is None:
                child = node.children[token] = _Node(token)
                child.count = 1
                node.order.append(child)  # a new child joins at the tail
            else:
                _increment(node, child)
            active[index] = child

    def remove(self, sequence: int, tokens: list[int]) -> None:
        """SuffixTree::remove: every suffix of the sequence's ``tokens`` (at most max_depth deep)
        counted out, a node counted to 0 removed with what hangs below it."""
        self.active.pop(sequence, None)
        for start in range(len(tokens)):
            node = self.root
            node.count -= 1
            for token in tokens[start:start + self.max_depth]:
                child = node.children.get(token)
                if child is None:
                    break
                if child.count > 1:
                    _decrement(node, child)
                else:
                    node.order.remove(child)
                    del node.children[token]
                    break
                node = child

    def _match(self, context: list[int]) -> _Node | None:
        node = self.root
        for token in context:
            node = node.children.get(token)
            if node is None:
                return None
        return node

    def speculate(self, context: list[int], max_spec_tokens: int, max_spec_factor: float, max_spec_offset: float,
                  min_token_prob: float) -> tuple[list[int], float]:
        """SuffixTree::speculate with use_tree_spec off -> (draft token ids, score)."""
        import numpy as np

        f32 = np.float32
        factor, offset, min_prob = f32(max_spec_factor), f32(max_spec_offset), f32(min_token_prob)
        best, best_score = [], f32(0.0)
        for match_len in range(1, len(context)):
            node = self._match(context[len(context) - match_len:])
            if node is None:
                break
            # static_cast<int>(match_len * max_spec_factor + max_spec_offset + 1e-6): float, then double
            max_tokens = max(min(max_spec_tokens, int(float(f32(match_len) * factor + offset) + 1e-6)), 0)
            draft, score, prob = [], f32(0.0), f32(1.0)
            while len(draft) < max_tokens and prob >= min_prob:
                if not node.order:
                    break
                child = node.order[0]
                prob = f32(prob * f32(f32(child.count) / f32(node.count)))
                if not prob >= min_prob:
                    break
                draft.append(child.token)
                score = f32(score + prob)
                node = child
            if score >= best_score:
                best, best_score = draft, score
        return best, float(best_score)


class SuffixCache:
    """Arctic Inference's SuffixDecodingCache's global tree: the responses of the requests one server
    served, the last max_cached_requests of them (0: none, no global tree), evicted first in, first
    out as a request starts."""

    def __init__(self, settings: SuffixSettings = SuffixSettings()):
        self.settings = settings
        self.tree = SuffixTree(settings.max_tree_depth)
        self.responses: dict[int, list[int]] = {}  # cached sequences, oldest first
        self.next_sequence = 0

    def start(self) -> int | None:
        """A new request's sequence in the tree (None when nothing is cached), evicting the oldest."""
        if self.settings.max_cached_requests == 0:
            return None
        sequence, self.next_sequence = self.next_sequence, self.next_sequence + 1
        self.responses[sequence] = []
        while len(self.responses) > self.settings.max_cached_requests:
            oldest = next(iter(self.responses))
            self.tree.remove(oldest, self.responses.pop(oldest))
        return sequence

    def add(self, sequence: int | None, token: int) -> None:
        if sequence is not None and sequence in self.responses:
            self.responses[sequence].append(token)
            self.tree.append(token, sequence)


class SuffixDrafter:
    """One request's suffix decoding as vLLM's SuffixDecodingProposer drives Arctic Inference's
    cache: a prompt tree over the whole verified sequence and the server's global tree of responses
    (``cache``, shared with the requests decoded before it; a fresh one when None: a server with no
    earlier responses), this request's response added to it as it is verified. Only verified tokens
    are fed, so nothing rolls back; when the request ends, the tokens its last step sampled past its
    budget or its stop token are added too (finish), as vLLM adds every sampled token.

    The prompt is the sequence at the first propose or the first rollback, whichever comes first:
    the prefill's rollback comes first on the engines' schedule (drafting starts after the first
    token), the first propose on ours (the prefill verifies the first drafts, the sequence is the
    prompt).
    """

    def __init__(self, vocab_size: int, settings: SuffixSettings = SuffixSettings(), sampling: bool = False,
                 cache: SuffixCache | None = None):
        self.vocab_size = vocab_size
        self.settings = settings
        self.sampling = sampling
        self.forwards = 0  # no model, kept for the metrics
        self.prompt_tree = SuffixTree(settings.max_tree_depth)
        self.cache = cache if cache is not None else SuffixCache(settings)
        self.sequence: int | None = None  # this response's sequence in the global tree
        self.prompt_length: int | None = None
        self.fed = 0  # tokens of the sequence the trees hold

    def feed(self, token_list: list[int]) -> None:
        """Append the verified tokens the trees lack (the prompt's only to the prompt tree)."""
        if self.prompt_length is None:
            self.prompt_length = len(token_list)
        if self.fed == 0:  # the request starts: vLLM's start_request on its first draft step
            self.sequence = self.cache.start()
        for position in range(self.fed, len(token_list)):
            self.prompt_tree.append(token_list[position])
            if position >= self.prompt_length:
                self.cache.add(self.sequence, token_list[position])
        self.fed = len(token_list)

    def finish(self, sampled: list[int]) -> None:
        """The request ended: ``sampled`` is its sequence with every token its last step sampled;
        the response's tokens the cache lacks are added (vLLM proposes after that step too)."""
        self.feed(sampled)

    def draft(self, token_list: list[int], k: int) -> list[int]:
        """At most k draft token ids continuing the verified `token_list` (fewer, or none, where the
        trees' counts do not carry them). vLLM also caps k at max_model_len - 1 minus the sequence
        length; the decode loop caps k at the token budget before asking."""
        self.feed(token_list)
        settings = self.settings
        context = token_list[max(0, len(token_list) - settings.max_tree_depth):]
        drafts = [tree.speculate(context, k, settings.max_spec_factor, 0.0, settings.min_token_prob)
                  for tree in (self.prompt_tree, self.cache.tree)]
        (prompt_draft, prompt_score), (global_draft, global_score) = drafts
        return prompt_draft if prompt_score >= global_score else global_draft

    def propose(self, request: DraftRequest) -> Proposal:
        """The trees' draft continuing request.token_list -> (draft_token_ids # [<=k], draft_probs #
        [<=k, vocab] point masses, or None when greedy)."""
        return point_mass_proposal(self.draft(request.token_list, request.k), self.vocab_size, self.sampling, request.tokens.device)

    def rollback(self, valid_length: int, hidden_states=None) -> None:
        """Nothing to drop (only verified tokens are fed); the first call fixes the prompt length."""
        if self.prompt_length is None:
            self.prompt_length = valid_length


def check(config) -> None:
    """vLLM's own rules on the settings (RuntimeConfigError in its words)."""
    from specreg.errors import RuntimeConfigError

    if config.suffix is not None and config.suffix.problem():
        raise RuntimeConfigError(config.suffix.problem())


def drafter(pair, configs, generators) -> PerRowDrafter:
    return PerRowDrafter([SuffixDrafter(pair.vocab_size, c.suffix or SuffixSettings(), c.temperature > 0, c.session)
                          for c in configs])


def session(config) -> SuffixCache:
    """The global tree one server keeps across the requests it serves (DecodeConfig.session)."""
    return SuffixCache(config.suffix or SuffixSettings())


# the target alone, as for n-gram: nothing but the sequence drafts
METHOD = Method(name="suffix", load=ngram_load, drafter=drafter, check=check, session=session)

"""Tree verification: many candidate continuations checked in ONE target forward.

A candidate tree is given as paths of top-i ranks per depth, as Medusa's `medusa_choices` and
the `--tree` of registration: ((0,), (1,), (0, 0), (0, 1), (0, 0, 0)) is the top-1 and top-2
candidates for the next token, the top-1 and top-2 after the top-1, and the top-1 after that.
Node 0 is the root: the last verified token, whose keys the target cache does not hold yet.

One step of one row, as tree_forward and compact_cache run it (choose_k times a tree step so):
1. tree_candidates: per-depth ranked proposals -> the token of every node.
2. tree_forward: one target forward over the uncached tokens (ending with the root) and all
   nodes, under the causal mask over the cached prefix combined with the tree mask (a node sees
   the prefix and its own ancestors only) and with each node at position root + depth, so each
   node's logits are those of decoding its path sequentially.
3. acceptance_rule.tree_greedy_accept / tree_rejection_sample: the kept path and the emitted tokens.
4. compact_cache: keep the prefix and the kept path's nodes, in order, so the cache equals one
   built by decoding the accepted tokens one by one.
The decode loop (runtime/decode.py) runs the same step for many rows at once: the same mask and
positions through row_cache.RowCache, where the nodes off the accepted path become invalid
columns instead of being compacted away.

What we followed: FasterDecoding/Medusa medusa/model/utils.py generate_medusa_buffers (paths
sorted by (len, path); mask with the root column set; position ids = depth; retrieve indices of
every path that is no other path's prefix, root first) and tree_decoding (positions offset by
the sequence length); transformers 5.24 masking_utils._preprocess_mask_arguments returns a 4-D
mask as given, eager attention adds it to the scores (so the mask is additive float: 0 / dtype
min), DynamicLayer keeps keys/values as [batch, kv_heads, seq, head_dim] (cache_utils.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specreg.errors import RuntimeConfigError
from specreg.runtime.forward import forward_logits


@dataclass(frozen=True)
class CandidateTree:
    """The tree's shape; node i (1-based) is paths[i - 1], node 0 the root."""

    paths: tuple[tuple[int, ...], ...]  # sorted by (depth, path)
    parents: tuple[int, ...]  # [nodes+1] parent node, -1 for the root
    depths: tuple[int, ...]  # [nodes+1] 0 for the root
    _buffers: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def num_nodes(self) -> int:
        """Candidate tokens verified per step (the root excluded): the tree's size."""
        return len(self.paths)

    @property
    def depth(self) -> int:
        return max(self.depths)

    @property
    def width(self) -> int:
        """Ranks used at the widest depth: how many proposals per depth the drafter must give."""
        return 1 + max(path[-1] for path in self.paths)

    def pruned(self, max_depth: int) -> "CandidateTree":
        """The nodes at depth <= max_depth (a step near the token budget)."""
        if max_depth >= self.depth:
            return self
        return parse_tree([path for path in self.paths if len(path) <= max_depth])

    def buffers(self, device):
        """The tree's tensors on `device`, built once per device -> TreeBuffers."""
        key = str(device)
        if key not in self._buffers:
            self._buffers[key] = build_buffers(self, device)
        return self._buffers[key]


@dataclass(frozen=True)
class TreeBuffers:
    attention_mask: object  # [nodes+1, nodes+1] bool: node i sees node j (j an ancestor of i, or i)
    depths: object  # [nodes+1] long: position of node i after the root's
    parent_ids: object  # [nodes+1] long, -1 for the root
    retrieve_indices: object  # [leaves, depth+1] long: nodes of each root-to-leaf path, -1 padded
    ranks: object  # [nodes+1] long: the node's rank among its depth's proposals (0 for the root)


def parse_tree(paths) -> CandidateTree:
    """Paths of non-negative ranks (lists or tuples, any order) -> CandidateTree.

    Raises RuntimeConfigError (a user's --tree) for an empty tree, an empty or non-integer path,
    a repeated path, or a path whose parent path is not in the tree.
    """
    try:
        normalised = [tuple(path) for path in paths]
    except TypeError:
        raise RuntimeConfigError(f"tree {paths!r}: expected a list of paths such as [[0], [1], [0, 0]]") from None
    if not normalised:
        raise RuntimeConfigError("tree is empty: give at least one path, e.g. [[0]]")
    for path in normalised:
        if not path or not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in path):
            raise RuntimeConfigError(f"tree path {list(path)!r}: must be a non-empty list of ranks >= 0")
    if len(set(normalised)) != len(normalised):
        repeated = next(p for p in normalised if normalised.count(p) > 1)
        raise RuntimeConfigError(f"tree path {list(repeated)} appears twice")
    ordered = tuple(sorted(normalised, key=lambda path: (len(path), path)))
    index = {path: node for node, path in enumerate(ordered, start=1)}
    parents = [-1]
    for path in ordered:
        parent = () if len(path) == 1 else path[:-1]
        if parent and parent not in index:
            raise RuntimeConfigError(f"tree path {list(path)}: its parent {list(parent)} is not in the tree")
        parents.append(index[parent] if parent else 0)
    return CandidateTree(paths=ordered, parents=tuple(parents), depths=(0,) + tuple(len(p) for p in ordered))


def chain_tree(k: int) -> CandidateTree:
    """k top-1 candidates in a row: chain speculation as a tree."""
    return parse_tree([(0,) * depth for depth in range(1, k + 1)])


def build_buffers(tree: CandidateTree, device) -> TreeBuffers:
    import torch

    size = tree.num_nodes + 1
    mask = torch.eye(size, dtype=torch.bool)
    for node in range(1, size):
        ancestor = tree.parents[node]
        while ancestor >= 0:
            mask[node, ancestor] = True
            ancestor = tree.parents[ancestor]
    is_parent = set(tree.parents)
    # leaves in the lexicographic order of their paths: a greedy tie goes to the higher ranks
    leaves = sorted((node for node in range(1, size) if node not in is_parent), key=lambda n: tree.paths[n - 1])
    retrieve = []
    for leaf in leaves:
        path = [leaf]
        while tree.parents[path[-1]] >= 0:
            path.append(tree.parents[path[-1]])
        retrieve.append(path[::-1] + [-1] * (tree.depth + 1 - len(path)))
    return TreeBuffers(
        attention_mask=mask.to(device),
        depths=torch.tensor(tree.depths, dtype=torch.long, device=device),
        parent_ids=torch.tensor(tree.parents, dtype=torch.long, device=device),
        retrieve_indices=torch.tensor(retrieve, dtype=torch.long, device=device),
        ranks=torch.tensor((0,) + tuple(p[-1] for p in tree.paths), dtype=torch.long, device=device),
    )


def tree_candidates(root_token_id, proposals, tree: CandidateTree):
    """Medusa's candidates: the node at depth d with last rank r gets proposals[d - 1, r].

    root_token_id  # [1] or int  the last verified token
    proposals      # [depth, width] ranked token ids per depth (head d-1's top-k)
    Returns node_token_ids # [nodes+1], root first.
    """
    import torch

    buffers = tree.buffers(proposals.device)
    root = torch.as_tensor(root_token_id, dtype=torch.long, device=proposals.device).view(1)
    depths, ranks = buffers.depths[1:], buffers.ranks[1:]
    return torch.cat([root, proposals[depths - 1, ranks]])


def tree_forward(model, cache, pending_ids, node_token_ids, tree: CandidateTree,
                 hidden_state_ids: tuple[int, ...] | None = None):
    """One target forward over the uncached tokens and the tree, appending all to `cache`.

    pending_ids     # [1, n]      tokens the cache lacks, the root (= node_token_ids[0]) last
    node_token_ids  # [nodes+1]   root first
    hidden_state_ids: indices into transformers' hidden_states as in forward.forward_logits (0 = the
    embeddings, num_hidden_layers = the decoder's final normed state, the default when none are
    given: what lm_head and Medusa heads read).
    Returns (logits # [nodes+1, vocab] at the root and each node, hidden # [n - 1 + nodes+1, A * H]:
    the requested states of every position fed, the pending tokens before the root first).
    A step without a tree (the prefill, a target-only step) is forward.forward_logits' causal forward.
    """
    import torch

    device = pending_ids.device
    buffers = tree.buffers(device)
    size = tree.num_nodes + 1
    past = cache.get_seq_length()
    before_root = pending_ids.shape[1] - 1
    queries = before_root + size
    allowed = torch.zeros(queries, past + queries, dtype=torch.bool, device=device)
    allowed[:, :past] = True  # everything cached is an earlier verified token
    allowed[:before_root, past:past + before_root] = torch.ones(before_root, before_root, dtype=torch.bool,
                                                                device=device).tril()
    allowed[before_root:, past:past + before_root] = True
    allowed[before_root:, past + before_root:] = buffers.attention_mask
    dtype = next(model.parameters()).dtype
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(~allowed, torch.finfo(dtype).min)
    position_ids = torch.cat([torch.arange(past, past + before_root, device=device),
                              past + before_root + buffers.depths]).view(1, -1)  # [1, queries]
    input_ids = torch.cat([pending_ids[:, :-1], node_token_ids.view(1, -1)], dim=1)  # [1, queries]
    final = model.config.num_hidden_layers
    hidden_state_ids = tuple(hidden_state_ids or (final,))
    # the decode loop's own forward (forward.forward_logits), with the tree's mask and positions
    logits, hidden = forward_logits(model, input_ids, cache, size, hidden_state_ids,
                                    attention_mask=mask.view(1, 1, queries, -1), position_ids=position_ids)
    return logits[0], hidden[0]


def compact_cache(cache, keep_length: int, accepted_nodes) -> None:
    """After tree_forward: keep the first keep_length positions (prefix and root) and the
    accepted nodes' positions after them, in path order; drop the rest of the tree.

    accepted_nodes # [m] node indices (1-based), root to leaf. Raises RuntimeConfigError for cache
    layers that cannot be gathered (sliding-window or other non-dynamic layers).
    """
    import torch

    # the accepted nodes' entries (gathered first) move down to keep_length.. in path order, then
    # the tail is cut: only m rows are copied, not the whole prefix (1.35x -> 1.25x a one-token
    # step for an 8-node tree on the demo target). Leading nodes already in their
    # place (node i at keep_length - 1 + i: node 1, and node 2 after it when the tree starts as a
    # chain) are not copied: a step that keeps only the top-1 child, the most common one, moves
    # nothing (0.21 -> 0.04 ms a step on the demo target's 20 layers)
    count = accepted_nodes.shape[0]
    nodes = accepted_nodes.tolist()  # a handful of ints; the decode loop syncs on each step anyway
    in_place = 0
    while in_place < count and nodes[in_place] == in_place + 1:
        in_place += 1
    source = None
    for layer in cache.layers:
        if type(layer).__name__ != "DynamicLayer":
            raise RuntimeConfigError(f"tree verification needs full-attention dynamic cache layers, "
                                     f"not {type(layer).__name__}")
        if layer.keys is None or layer.keys.numel() == 0:
            continue
        if in_place < count:
            if source is None:
                source = torch.tensor(nodes[in_place:], dtype=torch.long, device=layer.keys.device) + keep_length - 1
            start = keep_length + in_place
            layer.keys[..., start:keep_length + count, :] = layer.keys.index_select(-2, source)
            layer.values[..., start:keep_length + count, :] = layer.values.index_select(-2, source)
        layer.keys = layer.keys[..., :keep_length + count, :]
        layer.values = layer.values[..., :keep_length + count, :]

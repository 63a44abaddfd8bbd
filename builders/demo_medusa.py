"""Medusa heads for the demo target (demo_pair.py), trained here on the target's own hidden
states over the demo corpus, cached like the demo pair.

Training is Medusa-1 with self-distillation: the target is frozen; head i at position t reads
the target's final normed state h_t and learns the target's own next-token distribution at
position t + 1 + i (soft cross-entropy), i.e. what the target will say i + 2 tokens after t
given the true prefix. The target's states and distributions are computed once for a fixed set
of corpus windows, then the heads (a few small matrices) train on them.
"""

from __future__ import annotations

import time
from pathlib import Path

MEDUSA_HEADS = 3
MEDUSA_LAYERS = 1
MEDUSA_WINDOWS = 96  # corpus windows of demo_pair.SEQUENCE_LENGTH tokens the target reads once
MEDUSA_TRAINING = (400, 1024)  # (steps, positions per step)
MEDUSA_LR = 3e-3
# the tree the demo verifies: Medusa-style, wider at the root, 4 nodes. On a CPU a verification
# forward grows with its queries, in steps: on this 2-core Xeon (1 thread, fp32, MKL) the demo
# target's linears jump at 6 rows (a GEMM kernel switch; 384x128: 7.5 us at 5 rows, 10.7 at 6), so
# the 5-node ((0,),(1,),(0,0),(0,1),(0,0,0)) costs 1.27x a one-token step and this one 1.17x, and
# the (0,1) node it drops does not pay for that: Medusa 2.35x vs 2.24x target-only, the EAGLE-3
# head's tree 2.25x vs 2.14x; the 8-node tree 2.20x / 2.06x (benchmarks/bench_trees.py
# --ignore-eos)
DEMO_TREE = ((0,), (1,), (0, 0), (0, 0, 0))


def medusa_cache_key(target_dir) -> str:
    """This file and its settings (demo_heads.demo_cache_key)."""
    from specreg.builders.demo_heads import demo_cache_key

    return demo_cache_key([__file__], target_dir, dict(heads=MEDUSA_HEADS, layers=MEDUSA_LAYERS,
                                                       windows=MEDUSA_WINDOWS, training=MEDUSA_TRAINING, lr=MEDUSA_LR))


def corpus_windows(stream, windows: int, length: int, seed: int):
    """`windows` random windows of stream # [tokens], drawn from `seed` -> token ids # [windows, length]."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, stream.shape[0] - length - 1, (windows,), generator=generator).tolist()
    return torch.stack([stream[s:s + length] for s in starts])


def target_states(target, stream, windows: int, length: int, seed: int):
    """The frozen target over corpus_windows(stream, windows, length, seed) -> (the windows # [windows,
    length], hidden # [windows, length, H] final normed states, probs # [windows, length, vocab])."""
    import torch

    tokens = corpus_windows(stream, windows, length, seed)  # [windows, length]
    hidden, probs = [], []
    with torch.inference_mode():
        for first in range(0, windows, 8):
            batch = tokens[first:first + 8]  # [b, length]
            states = target.get_decoder()(input_ids=batch).last_hidden_state  # [b, length, H]
            hidden.append(states)
            probs.append(torch.softmax(target.get_output_embeddings()(states).float(), dim=-1))
    return tokens, torch.cat(hidden), torch.cat(probs)


def train_medusa_heads(heads, hidden, probs, steps: int, batch: int, seed: int, max_lr: float, progress=None):
    """Head i at position t learns probs[:, t + 1 + i] from hidden[:, t]. hidden # [w, length, H],
    probs # [w, length, vocab]. progress(what, step, steps, "loss ...") after each step. Returns
    the heads in eval mode."""
    import torch

    from specreg.builders.demo_pair import OneCycleAdamW

    num_heads = heads.num_heads
    usable = hidden.shape[1] - num_heads  # positions t with t + num_heads inside the window
    inputs = hidden[:, :usable].reshape(-1, hidden.shape[-1]).clone()  # [m, H]
    labels = torch.stack([probs[:, 1 + i:1 + i + usable] for i in range(num_heads)])  # [heads, w, usable, vocab]
    labels = labels.reshape(num_heads, -1, probs.shape[-1])  # [heads, m, vocab]
    optimizer = OneCycleAdamW(heads.parameters(), steps, max_lr, clip=None)
    generator = torch.Generator().manual_seed(seed)
    heads.train()
    if progress:
        progress("demo Medusa heads: training", 0, steps)  # the clock of the ETA starts here
    for step in range(steps):
        rows = torch.randint(0, inputs.shape[0], (batch,), generator=generator)
        logits = heads(inputs[rows])  # [heads, batch, vocab]
        loss = -(labels[:, rows] * torch.log_softmax(logits.float(), dim=-1)).sum(-1).mean()
        optimizer.step(loss)
        if progress:
            progress("demo Medusa heads: training", step + 1, steps, f"loss {loss.item():.3f}")
    return heads.eval()


def build_demo_medusa(out_dir, target_dir, *, force: bool = False, progress=None) -> Path:
    """Build (or reuse the cached) Medusa heads for the demo target in `target_dir` -> out_dir,
    a Medusa head directory (config.json, medusa_lm_head.safetensors, demo-heads.json)."""
    from specreg.builders.demo_heads import cached_build, frozen_target, write_stamp
    from specreg.builders.demo_pair import SEQUENCE_LENGTH
    from specreg.runtime.methods.medusa import WEIGHTS_FILE, new_medusa_heads, save_medusa_heads

    out_dir, target_dir = Path(out_dir), Path(target_dir)
    key = medusa_cache_key(target_dir)
    if cached_build(out_dir, "demo-heads.json", key, WEIGHTS_FILE, force):
        return out_dir
    started, cpu_started = time.perf_counter(), time.process_time()
    target, stream = frozen_target(target_dir)
    _, hidden, probs = target_states(target, stream, MEDUSA_WINDOWS, SEQUENCE_LENGTH, seed=4)
    heads = new_medusa_heads(target, MEDUSA_HEADS, MEDUSA_LAYERS, seed=4)
    train_medusa_heads(heads, hidden, probs, *MEDUSA_TRAINING, seed=4, max_lr=MEDUSA_LR, progress=progress)
    save_medusa_heads(heads, out_dir, str(target_dir.resolve()))
    write_stamp(out_dir, "demo-heads.json", key, started, cpu_started, tree=[list(path) for path in DEMO_TREE])
    return out_dir


def build_demo(directory, target_dir, *, force: bool = False, progress=None) -> list[str]:
    """The demo-pair command's Medusa step: the heads (DIRECTORY/medusa) and the tree to register
    them with -> the lines it prints."""
    import json

    heads = build_demo_medusa(Path(directory) / "medusa", target_dir, force=force, progress=progress)
    return [f"medusa: {heads}", f"tree:   {json.dumps([list(path) for path in DEMO_TREE], separators=(',', ':'))}"]

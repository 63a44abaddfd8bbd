"""A demo target with an MTP layer: the demo target (demo_pair.py) plus one DeepSeek-style MTP
module trained here on the target's own hidden states, saved the way such targets ship it
(num_nextn_predict_layers in config.json, the module under model.layers.{N}.* in the weights).
Cached like the demo pair.

Training is self-distillation with the target frozen, on the target states demo_medusa computes
once for fixed corpus windows (final normed states and next-token distributions): entry i reads
(t_{i+1}, h_i) at position i and learns the target's greedy token at position i + 1
(cross-entropy), i.e. the token after t_{i+1}: DeepSeek-V3 trains its MTP module to predict one
token further than the model; we fit the target's own choice there, what greedy acceptance
measures (as demo_heads fits EAGLE-3). Training-time test (as demo_heads trains EAGLE-3): step s >= 1
feeds the layer's own normed output of step s - 1 at the next position with the corpus token
there, attending to step 0's entries up to it and its own earlier steps' entries, so the drafts
after the first (which vLLM drafts the same way) are trained too.
"""

from __future__ import annotations

import time
from pathlib import Path

MTP_WINDOWS = 192  # corpus windows of demo_pair.SEQUENCE_LENGTH tokens the target reads once
# (steps, windows per step): 47 CPU-s at one thread, greedy acceptance 0.876 at k = 3 on the smoke
# set (240 steps: 0.853)
MTP_TRAINING = (120, 8)
MTP_LR = 3e-3
MTP_TTT_STEPS = 3


def mtp_cache_key(target_dir) -> str:
    """This file, the MTP module's code (mtp.py), the target states' code (demo_medusa.py) and the
    settings (demo_heads.demo_cache_key)."""
    from importlib.util import find_spec

    from specreg.builders.demo_heads import demo_cache_key

    here = Path(__file__).resolve().parent
    code = [here / "demo_mtp.py", find_spec("specreg.runtime.methods.mtp").origin, here / "demo_medusa.py"]
    return demo_cache_key(code, target_dir,
                          dict(windows=MTP_WINDOWS, training=MTP_TRAINING, lr=MTP_LR, ttt=MTP_TTT_STEPS))


def train_mtp_head(head, tokens, hidden, probs, steps: int, batch: int, seed: int, max_lr: float,
                   ttt_steps: int = MTP_TTT_STEPS, progress=None):
    """Train head.layers[0] on target windows: tokens # [w, L], hidden # [w, L, H] the target's
    final normed states, probs # [w, L, vocab] its next-token distributions. Entry i of step s
    (token t_{i+1+s} at position i+s) learns argmax probs[:, i+1+s]. progress(what, step, steps,
    "loss ...") after each step. Returns the head in eval mode."""
    import torch
    from transformers import DynamicCache

    from specreg.builders.demo_pair import OneCycleAdamW

    trainable = list(head.layers.parameters())
    for name, parameter in head.named_parameters():
        parameter.requires_grad_(name.startswith("layers."))
    optimizer = OneCycleAdamW(trainable, steps, max_lr)
    generator = torch.Generator().manual_seed(seed)
    greedy = probs.argmax(dim=-1)  # [w, L] the target's greedy token after each position
    length = tokens.shape[1] - 1  # entries per step: positions 0 .. L-2
    index = torch.arange(length)
    causal = index[None, :] <= index[:, None]  # [length, length] step 0 over step 0
    diagonal = torch.eye(length, dtype=torch.bool)  # step s over an earlier step's entries
    head.train()
    if progress:
        progress("demo MTP layer: training", 0, steps)  # the clock of the ETA starts here
    for step in range(steps):
        rows = torch.randint(0, tokens.shape[0], (batch,), generator=generator)
        window, labels = tokens[rows], greedy[rows]  # [b, L], [b, L]
        state = hidden[rows, :length]  # [b, length, H] h_0 .. h_{L-2}
        cache = DynamicCache(config=head.config)
        loss = 0.0
        for ttt in range(ttt_steps):
            # index i at step s: token t_{i+1+s} at position i+s (zero-padded past the window's end)
            step_tokens = torch.cat([window[:, 1 + ttt:], window.new_zeros(batch, ttt)], dim=1)  # [b, length]
            mask = torch.cat([causal] + [diagonal] * ttt, dim=1).view(1, 1, length, (ttt + 1) * length)
            prenorm = head(step_tokens, state, cache, ttt, attention_mask=mask)  # [b, length, H]
            logits = head.draft_logits(prenorm[:, : length - ttt])  # [b, length - ttt, vocab]
            loss = loss + torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(),
                                                            labels[:, 1 + ttt:].flatten())
            state = head.recycle(prenorm)
        optimizer.step(loss)
        if progress:
            progress("demo MTP layer: training", step + 1, steps, f"loss {loss.item() / ttt_steps:.3f}")
    for parameter in head.parameters():
        parameter.requires_grad_(False)
    return head.eval()


def build_demo_mtp(out_dir, target_dir, *, force: bool = False, progress=None) -> Path:
    """Build (or reuse the cached) demo target with one trained MTP layer -> out_dir: the files of
    target_dir, config.json with num_nextn_predict_layers = 1, and model.safetensors with the MTP
    module under model.layers.{num_hidden_layers}.* (DeepSeek names; mtp.save_target_with_mtp)."""
    from specreg.builders.demo_heads import cached_build, frozen_target, write_stamp

    out_dir, target_dir = Path(out_dir), Path(target_dir)
    key = mtp_cache_key(target_dir)
    if cached_build(out_dir, "demo-mtp.json", key, "model.safetensors", force):
        return out_dir  # found before torch and transformers are imported
    from specreg.builders.demo_medusa import target_states
    from specreg.builders.demo_pair import SEQUENCE_LENGTH
    from specreg.runtime.methods.mtp import new_mtp_head, save_target_with_mtp
    started, cpu_started = time.perf_counter(), time.process_time()
    target, stream = frozen_target(target_dir)
    windows, hidden, probs = target_states(target, stream, MTP_WINDOWS, SEQUENCE_LENGTH, seed=6)  # [w, L], ...
    head = new_mtp_head(target, seed=6)
    train_mtp_head(head, windows, hidden, probs, *MTP_TRAINING, seed=6, max_lr=MTP_LR, progress=progress)
    save_target_with_mtp(head, target_dir, out_dir)
    write_stamp(out_dir, "demo-mtp.json", key, started, cpu_started)
    return out_dir


def build_demo(directory, target_dir, *, force: bool = False, progress=None) -> list[str]:
    """The demo-pair command's MTP step: the demo target with its MTP layer (DIRECTORY/target-mtp)
    -> the lines it prints."""
    return [f"mtp: {build_demo_mtp(Path(directory) / 'target-mtp', target_dir, force=force, progress=progress)}"]

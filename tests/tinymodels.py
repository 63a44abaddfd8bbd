"""Tiny Llama-style models with a locally trained tokenizer, built in the test session.

Nothing is downloaded: the tokenizer is a byte-level BPE trained on a few lines of text made
here, the models are random LlamaForCausalLM weights saved as safetensors. ``build_other``
makes a GPT-2 or Qwen2 architecture model over the same tokenizer files (copied byte for byte);
``build_deepseek_v3`` a DeepSeek-V3 target with MTP layers, config and tokenizer only, for the
engines' config code (tests/engines).
"""

from __future__ import annotations

import json
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}</s>\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "hello world, this is a tiny corpus for a tiny tokenizer",
    "def add(a, b):\n    return a + b\n",
    "dear customer, thank you for your order. your package ships today.",
    "speculative decoding proposes tokens with a draft and verifies them with a target",
    "summary: the meeting moved to friday at noon.",
] * 20

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>", "<|user|>", "<|assistant|>", "<|system|>"]


def build_tokenizer(directory: Path, vocab_size: int = 300, chat_template: str | None = CHAT_TEMPLATE,
                    extra_special: list[str] | None = None, llama_layout: bool = False):
    """Train a byte-level BPE tokenizer and save it in Hugging Face format; return it.
    ``llama_layout``: the demo pair's Llama 2 layout instead (byte fallback), which llama.cpp's
    converter reads; its byte-level BPE of our own it refuses."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if llama_layout:
        from specreg.builders.demo_pair import byte_fallback_bpe

        fast = byte_fallback_bpe(CORPUS, vocab_size, SPECIAL_TOKENS + list(extra_special or []))
        fast.chat_template = chat_template
        Path(directory).mkdir(parents=True, exist_ok=True)
        fast.save_pretrained(directory)
        return fast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS + list(extra_special or []),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
    )
    if chat_template is not None:
        fast.chat_template = chat_template
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(directory)
    return fast


def build_llama(directory: Path, tokenizer_dir: Path | None = None, *, seed: int = 0,
                hidden_size: int = 64, num_layers: int = 2, num_heads: int = 4,
                num_kv_heads: int = 2, intermediate_size: int = 128, vocab_size: int | None = None,
                max_position_embeddings: int = 512, tokenizer=None):
    """Save a random tiny LlamaForCausalLM (safetensors) with the tokenizer beside it."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if tokenizer is None:
        if tokenizer_dir is None:
            tokenizer = build_tokenizer(directory)
        else:
            tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    tokenizer.save_pretrained(directory)
    config = LlamaConfig(
        vocab_size=vocab_size or len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.save_pretrained(directory, safe_serialization=True)
    return directory


def build_other(directory: Path, tokenizer_dir: Path, architecture: str, *, seed: int = 0,
                hidden_size: int = 64, num_layers: int = 2, num_heads: int = 4,
                max_position_embeddings: int = 512):
    """Save a random tiny ``gpt2`` (GPT2LMHeadModel: n_layer/n_head/n_embd config names) or
    ``qwen2`` (Qwen2ForCausalLM) model; the tokenizer files of ``tokenizer_dir`` are copied as
    they are, so both sides of a pair hold byte-identical tokenizer files."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Qwen2Config, Qwen2ForCausalLM

    directory = Path(directory)
    common = dict(copy_tokenizer(tokenizer_dir, directory), tie_word_embeddings=False)
    if architecture == "gpt2":
        config = GPT2Config(n_embd=hidden_size, n_layer=num_layers, n_head=num_heads,
                            n_positions=max_position_embeddings, **common)
        model_class = GPT2LMHeadModel
    elif architecture == "qwen2":
        config = Qwen2Config(hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                             num_hidden_layers=num_layers, num_attention_heads=num_heads,
                             num_key_value_heads=num_heads // 2,
                             max_position_embeddings=max_position_embeddings, **common)
        model_class = Qwen2ForCausalLM
    else:
        raise ValueError(f"architecture must be gpt2 or qwen2, not {architecture!r}")
    torch.manual_seed(seed)
    model_class(config).save_pretrained(directory, safe_serialization=True)
    return directory


def copy_tokenizer(tokenizer_dir: Path, directory: Path) -> dict[str, int]:
    """Copy the tokenizer files of ``tokenizer_dir`` byte for byte into ``directory`` (made if
    absent); return the config fields they fix: {"vocab_size", "bos_token_id", "eos_token_id"}."""
    import shutil

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer_files = [p for p in Path(tokenizer_dir).iterdir()
                       if p.is_file() and p.name not in ("config.json", "generation_config.json")
                       and not p.name.endswith(".safetensors")]
    for path in tokenizer_files:
        shutil.copyfile(path, directory / path.name)
    vocab = json.loads((Path(tokenizer_dir) / "tokenizer.json").read_text())
    vocab_size = max([*vocab["model"]["vocab"].values(), *(t["id"] for t in vocab["added_tokens"])]) + 1
    ids = {t["content"]: t["id"] for t in vocab["added_tokens"]}
    return {"vocab_size": vocab_size, "bos_token_id": ids["<s>"], "eos_token_id": ids["</s>"]}


def build_deepseek_v3(directory: Path, tokenizer_dir: Path, *, hidden_size: int = 64, num_layers: int = 2,
                      num_nextn_predict_layers: int = 1) -> Path:
    """Write a tiny DeepSeek-V3 target with MTP layers, config and tokenizer only: a config.json
    saved by transformers' DeepseekV3Config (model_type "deepseek_v3", DeepseekV3ForCausalLM, MLA
    and MoE fields at tiny sizes, num_nextn_predict_layers) and the tokenizer files of
    ``tokenizer_dir``. No weights: the engines' config code reads none (the dtype is stated in
    the config and the embeddings are untied, so vLLM never reads the safetensors headers)."""
    from transformers import DeepseekV3Config

    directory = Path(directory)
    config = DeepseekV3Config(
        **copy_tokenizer(tokenizer_dir, directory),
        hidden_size=hidden_size, intermediate_size=2 * hidden_size, moe_intermediate_size=hidden_size // 2,
        num_hidden_layers=num_layers, first_k_dense_replace=1,  # layer 0 dense, the rest MoE
        n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, n_group=1, topk_group=1,
        num_attention_heads=4, num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=16,
        qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, max_position_embeddings=512,
        num_nextn_predict_layers=num_nextn_predict_layers, tie_word_embeddings=False, dtype="float32",
    )
    config.architectures = ["DeepseekV3ForCausalLM"]
    config.save_pretrained(directory)
    return directory


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def build_agreeing_pair(root: Path, *, target_layers: int = 8, seed: int = 0) -> tuple[Path, Path]:
    """A tiny (target, draft) pair that agrees and is faster than its target, with no training:
    the target's layers after the first add nothing to the residual stream (their attention and
    MLP output projections are zero, so each computes and adds exactly 0.0), and the draft is the
    target's first layer with the same embeddings, norm and head. The draft then proposes what the
    target would emit, bit for bit, at a fraction of its cost: a pair that passes the built-in
    policy's floors (acceptance, speedup) the way a well-matched real pair does. -> (target, draft)"""
    import torch
    from transformers import LlamaForCausalLM

    root = Path(root)
    build_tokenizer(root / "tokenizer")
    target_dir = build_llama(root / "target", root / "tokenizer", seed=seed, num_layers=target_layers)
    target = LlamaForCausalLM.from_pretrained(target_dir)
    with torch.no_grad():
        for layer in target.model.layers[1:]:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    target.save_pretrained(target_dir, safe_serialization=True)
    draft_dir = build_llama(root / "draft", root / "tokenizer", seed=seed, num_layers=1)
    draft = LlamaForCausalLM.from_pretrained(draft_dir)
    draft.load_state_dict({key: value for key, value in target.state_dict().items()
                           if not key.startswith("model.layers.") or key.startswith("model.layers.0.")})
    draft.save_pretrained(draft_dir, safe_serialization=True)
    return target_dir, draft_dir

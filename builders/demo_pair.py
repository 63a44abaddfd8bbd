"""A demo target/draft pair trained here, in about half a minute, on a corpus this file generates.

The pair is real (two Llama models, one shared BPE tokenizer in Llama 2's layout, with a chat template)
but tiny: the target is deep and narrow so that one decode step costs about 10x the one-layer
draft's on a CPU. The draft is trained first on formulaic text (support replies, summaries,
code, business mail, short stories); the target is grown from it (the draft's layer plus 19
layers that start as identity) and trained further, so the draft agrees with the target most
of the time (greedy acceptance ~0.8 on the golden prompts). Its speedup demonstrates the
runtime, not a real model. The build is cached in the output folder under a key from this
file's source and settings, the shipped golden prompts and the library versions.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}</s>\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>", "<|user|>", "<|assistant|>", "<|system|>"]
VOCAB_SIZE = 1024
SEQUENCE_LENGTH = 128
TARGET_SHAPE = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=20, num_attention_heads=4,
                    num_key_value_heads=2)
DRAFT_SHAPE = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=1, num_attention_heads=4,
                   num_key_value_heads=2)
# (steps, batch of SEQUENCE_LENGTH windows) and peak learning rates; the target is grown from the
# trained draft, then trained further: fewer steps than acceptance alone would ask for, because
# every first `make demo` pays them (their cost and the acceptance they reach: docs/benchmarks-log.md).
DRAFT_TRAINING = (160, 16)
DRAFT_LR = 3e-3
TARGET_TRAINING = (30, 8)
TARGET_LR = 1e-3

# ---- the corpus: five formulaic workloads, as raw text and as chat turns -------------------

ITEMS = ["order", "package", "invoice", "refund", "subscription", "account", "password", "parcel"]
PEOPLE = ["mr smith", "ms jones", "dr brown", "mrs white", "mr green", "ms taylor"]
DAYS = ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday"]
TIMES = ["at nine", "at ten", "at noon", "at two", "at four"]
TOPICS = ["the launch", "the meeting", "the budget", "the office move", "the new price list",
          "the sales numbers", "the server upgrade", "the hiring plan"]
PLACES = ["the sea", "a small town", "the city of glass", "an old lighthouse", "a green door",
          "the forest", "a quiet river"]
CREATURES = ["a small robot", "a fox", "a cat", "an old keeper", "a young girl", "a tired dog"]
FUNCTIONS = [
    ("add", "a, b", "return a + b"),
    ("subtract", "a, b", "return a - b"),
    ("square", "x", "return x * x"),
    ("is_even", "n", "return n % 2 == 0"),
    ("reverse_string", "s", "return s[::-1]"),
    ("count_words", "text", "return len(text.split())"),
    ("max_of_list", "items", "return max(items)"),
    ("mean", "values", "return sum(values) / len(values)"),
]


def support_reply(rng: random.Random) -> tuple[str, str]:
    item = rng.choice(ITEMS)
    question = rng.choice([
        f"my {item} has not arrived yet. what should i do?",
        f"how do i reset my {item}?",
        f"i was charged twice for the same {item}. can you help?",
        f"can i change the shipping address after i place an {item}?",
        f"where can i find my {item}?",
        f"the app crashes when i open my {item}. what can i try?",
        f"do you ship to {rng.choice(['canada', 'france', 'spain', 'japan'])}?",
        f"my {item} arrived damaged.",
        f"how do i cancel my {item}?",
    ])
    answer = (f"thank you for reaching out. i am sorry for the trouble with your {item}. "
              f"please check your email for a link, and we will help you within one day.")
    return question, answer


def summary(rng: random.Random) -> tuple[str, str]:
    topic, day = rng.choice(TOPICS), rng.choice(DAYS)
    text = (f"the team met on {rng.choice(DAYS)}. they agreed to move {topic} to {day} because the "
            f"tests were not done. {rng.choice(['sales', 'support', 'the manager'])} will tell the customers.")
    return f"summarize: {text}", f"the team moved {topic} to {day}."


def code(rng: random.Random) -> tuple[str, str]:
    name, args, body = rng.choice(FUNCTIONS)
    prompt = f"def {name}({args}):\n"
    completion = f'    """{name.replace("_", " ")} of {args}."""\n    {body}\n'
    if rng.random() < 0.3:
        completion += f"\n\nprint({name}({', '.join('1' for _ in args.split(','))}))\n"
    return prompt, completion


def business_mail(rng: random.Random) -> tuple[str, str]:
    person, day, at, topic = rng.choice(PEOPLE), rng.choice(DAYS), rng.choice(TIMES), rng.choice(TOPICS)
    request = rng.choice([f"write a short mail to {person}: {topic} moved to {day} {at}.",
                          f"write a mail to confirm a meeting on {day} {at}.",
                          "write a short mail to a customer: your package ships today.",
                          "write a mail to a supplier asking for a new price list."])
    mail = (f"dear {person},\n\nthank you for your message. this is a reminder that {topic} is on {day} "
            f"{at}. please let me know if you have any questions.\n\nbest regards,\nthe team")
    return request, mail


def creative(rng: random.Random) -> tuple[str, str]:
    creature, place = rng.choice(CREATURES), rng.choice(PLACES)
    request = rng.choice([f"tell me a story about {creature} in {place}.", f"write a short poem about {place}.",
                          f"describe a dream about {place}."])
    story = (f"once upon a time, {creature} lived near {place}. every morning it looked at the sky and "
             f"dreamed of {rng.choice(PLACES)}. one day the rain stopped, and {creature} found a lost key.")
    return request, story


WORKLOADS = [support_reply, summary, code, business_mail, creative]


def render_chat(messages: list[dict]) -> str:
    from jinja2 import Template

    return Template(CHAT_TEMPLATE).render(messages=messages, add_generation_prompt=False)


def demo_corpus(documents: int = 6000, seed: int = 0, golden_texts: list[str] | None = None) -> list[str]:
    """Generated training text: the five workloads as chat turns (through the chat template)
    and as raw text, plus each golden prompt text followed by its category's templated answer."""
    rng = random.Random(seed)
    corpus = []
    for index in range(documents):
        workload = WORKLOADS[index % len(WORKLOADS)]
        prompt, answer = workload(rng)
        if rng.random() < 0.6 and workload is not code:
            messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]
            if rng.random() < 0.3:
                messages.insert(0, {"role": "system", "content": "you are a helpful assistant."})
            corpus.append(render_chat(messages))
        elif workload is code:
            corpus.append(prompt + answer + "</s>\n")
        else:
            corpus.append(f"{prompt}\n{answer}</s>\n")
    for text in golden_texts or []:
        corpus.append(text)
    rng.shuffle(corpus)
    return corpus


def golden_texts() -> list[str]:
    """The shipped golden prompts, each rendered as it will be decoded and followed by a
    templated answer of its category, so the demo pair knows the domain it is validated on."""
    import yaml

    folder = Path(__file__).resolve().parent.parent / "golden_prompts"
    answers = {"support": support_reply, "summarization": summary, "code": code,
               "business_mail": business_mail, "creative": creative}
    rng = random.Random(1)
    texts = []
    for path in sorted(folder.glob("*.yaml")):
        data = yaml.safe_load(path.read_text()) or {}
        for record in data.get("records", []):
            workload = answers.get(record.get("category"), support_reply)
            for _ in range(8):
                answer = workload(rng)[1]
                if record.get("messages"):
                    texts.append(render_chat(list(record["messages"]) + [{"role": "assistant", "content": answer}]))
                elif record.get("prompt"):
                    texts.append(record["prompt"] + answer + "</s>\n")
    return texts


def cache_key() -> str:
    """Changes when this builder's code or settings, the golden prompts, or the versions of the
    libraries that train and tokenize change (any of them changes the weights)."""
    from importlib.metadata import version

    digest = hashlib.sha256(Path(__file__).read_bytes())
    # the settings as they are at run time: a patched shape or budget is a different pair
    settings = dict(vocab=VOCAB_SIZE, sequence=SEQUENCE_LENGTH, target=TARGET_SHAPE, draft=DRAFT_SHAPE,
                    target_training=TARGET_TRAINING, draft_training=DRAFT_TRAINING, lrs=(TARGET_LR, DRAFT_LR),
                    libraries={name: version(name) for name in ("torch", "transformers", "tokenizers")})
    digest.update(json.dumps(settings, sort_keys=True).encode())
    folder = Path(__file__).resolve().parent.parent / "golden_prompts"
    for path in sorted(folder.glob("*.yaml")):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


# ---- building ----------------------------------------------------------------------------

def train_tokenizer(corpus: list[str]):
    fast = byte_fallback_bpe(corpus, VOCAB_SIZE, SPECIAL_TOKENS)
    fast.chat_template = CHAT_TEMPLATE
    return fast


BYTE_TOKENS = [f"<0x{value:02X}>" for value in range(256)]


def byte_fallback_bpe(corpus: list[str], vocab_size: int, special_tokens: list[str]):
    """A BPE tokenizer trained on `corpus` laid out as Llama 2's: "▁" for spaces, the 256
    <0xNN> byte tokens in the vocabulary right after `special_tokens` (byte fallback for what
    training never saw). llama.cpp's convert_hf_to_gguf.py converts this layout as a SentencePiece
    vocabulary (conversion/base.py _set_vocab_llama_hf); a byte-level BPE of our own it refuses, its
    pre-tokenizer's hash being in none of its tables. -> a transformers PreTrainedTokenizerFast."""
    import json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tokenizer.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                           decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    # the trainer places its special tokens first in the vocabulary; the byte tokens then stay
    # ordinary tokens (decoded, never skipped as special), as in Llama 2
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(special_tokens) + BYTE_TOKENS,
                                  show_progress=False)
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    data = json.loads(tokenizer.to_str())
    data["added_tokens"] = [token for token in data["added_tokens"] if token["content"] not in BYTE_TOKENS]
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(data)), bos_token="<s>",
                                   eos_token="</s>", pad_token="<pad>", unk_token="<unk>")


def new_llama(shape: dict, tokenizer, seed: int):
    """A freshly initialised Llama of `shape` over the tokenizer's vocabulary."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), max_position_embeddings=1024, tie_word_embeddings=False,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, **shape)
    return LlamaForCausalLM(config)


def grow_from_draft(draft, shape: dict, tokenizer, seed: int):
    """A deep model of `shape` that starts as the one-layer draft's function (depth up-scaling).

    Embeddings, final norm, output head and layer 0 are the draft's; the added layers' output
    projections (attention o_proj, MLP down_proj) start at zero, so each adds nothing to the
    residual stream until training moves it. Training it further makes a target that agrees with
    its draft the way a distilled draft agrees with its target, for a fraction of the cost of
    training a deep narrow model from scratch (which needs ~150 steps to get past the draft).
    """
    import torch

    target = new_llama(shape, tokenizer, seed)
    for name in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads"):
        if getattr(target.config, name) != getattr(draft.config, name):
            raise ValueError(f"cannot grow the target from the draft: {name} differs")
    with torch.no_grad():
        target.model.embed_tokens.load_state_dict(draft.model.embed_tokens.state_dict())
        target.model.norm.load_state_dict(draft.model.norm.state_dict())
        target.lm_head.load_state_dict(draft.lm_head.state_dict())
        target.model.layers[0].load_state_dict(draft.model.layers[0].state_dict())
        for layer in target.model.layers[1:]:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    return target


class OneCycleAdamW:
    """The demo trainers' optimizer: AdamW (betas 0.9 / 0.95, no weight decay) under a one-cycle
    schedule up to max_lr over `steps` steps; step(loss) is one update (zero the gradients,
    backward, clip the gradient norm to `clip` unless None, step, advance the schedule)."""

    def __init__(self, parameters, steps: int, max_lr: float, clip: float | None = 1.0):
        import torch

        self.parameters = list(parameters)
        self.clip = clip
        self.optimizer = torch.optim.AdamW(self.parameters, lr=max_lr, weight_decay=0.0, betas=(0.9, 0.95))
        self.schedule = torch.optim.lr_scheduler.OneCycleLR(self.optimizer, max_lr=max_lr, total_steps=steps,
                                                            pct_start=0.1)

    def step(self, loss) -> None:
        import torch

        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.clip is not None:
            torch.nn.utils.clip_grad_norm_(self.parameters, self.clip)
        self.optimizer.step()
        self.schedule.step()


def train(model, stream, steps: int, batch_size: int, seed: int, max_lr: float, progress=None,
          what: str = "training"):
    """`steps` AdamW steps (one-cycle schedule up to max_lr) on random windows of `stream` # [tokens];
    progress(what, step, steps, "loss ...") after each step (specreg.cli.progress.Progress)."""
    import torch

    optimizer = OneCycleAdamW(model.parameters(), steps, max_lr)
    generator = torch.Generator().manual_seed(seed)
    model.train()
    if progress:
        progress(what, 0, steps)  # the clock of the ETA starts here
    for step in range(steps):
        starts = torch.randint(0, stream.shape[0] - SEQUENCE_LENGTH - 1, (batch_size,), generator=generator)
        batch = torch.stack([stream[s:s + SEQUENCE_LENGTH] for s in starts.tolist()])  # [batch, seq]
        loss = model(input_ids=batch, labels=batch).loss
        optimizer.step(loss)
        if progress:
            progress(what, step + 1, steps, f"loss {loss.item():.3f}")
    return model.eval()


def build_demo_pair(directory, *, force: bool = False, progress=None) -> tuple[Path, Path]:
    """Build (or reuse the cached) demo pair under `directory` -> (target_dir, draft_dir).

    Both are Hugging Face directories (config, safetensors, the same tokenizer files).
    progress(what, done, total, detail): each step of the build (specreg.cli.progress.Progress).
    A cached build is found without importing torch or transformers (seconds of imports).
    """

    directory = Path(directory)
    target_dir, draft_dir = directory / "target", directory / "draft"
    stamp = directory / "demo-pair.json"
    key = cache_key()
    if not force and stamp.is_file() and json.loads(stamp.read_text()).get("cache_key") == key \
            and (target_dir / "model.safetensors").is_file() and (draft_dir / "model.safetensors").is_file():
        return target_dir, draft_dir
    import torch

    from specreg.runtime.process import limit_threads, quiet_libraries

    limit_threads()
    quiet_libraries()
    started, cpu_started = time.perf_counter(), time.process_time()
    step = "demo pair: tokenizer and corpus"
    if progress:
        progress(step, 0, 1)
    corpus = demo_corpus(golden_texts=golden_texts())
    tokenizer = train_tokenizer(corpus)
    ids = tokenizer("".join(corpus), add_special_tokens=False)["input_ids"]
    stream = torch.tensor(ids, dtype=torch.long)  # [tokens]
    if progress:
        progress(step, 1, 1, f"{len(corpus)} documents, {stream.shape[0]} tokens, vocab {len(tokenizer)}")
    draft = train(new_llama(DRAFT_SHAPE, tokenizer, seed=2), stream, *DRAFT_TRAINING, seed=2, max_lr=DRAFT_LR,
                  progress=progress, what=f"demo pair: training the draft ({DRAFT_SHAPE['num_hidden_layers']} layer)")
    target = train(grow_from_draft(draft, TARGET_SHAPE, tokenizer, seed=1), stream, *TARGET_TRAINING, seed=1,
                   max_lr=TARGET_LR, progress=progress,
                   what=f"demo pair: training the target ({TARGET_SHAPE['num_hidden_layers']} layers)")
    for model, folder in ((target, target_dir), (draft, draft_dir)):
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        model.save_pretrained(folder, safe_serialization=True)
        tokenizer.save_pretrained(folder)
    stamp.write_text(json.dumps({"cache_key": key, "build_seconds": round(time.perf_counter() - started, 1),
                                 "build_cpu_seconds": round(time.process_time() - cpu_started, 1),
                                 "threads": torch.get_num_threads(),
                                 "target_shape": TARGET_SHAPE, "draft_shape": DRAFT_SHAPE}, indent=2))
    return target_dir, draft_dir

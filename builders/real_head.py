"""An EAGLE-3 head for the real pair's target (SmolLM2-135M-Instruct), trained here from the
target's own hidden states on text the target generates (nothing downloaded but the target).

The recipe (docs/llamacpp-heads.md, A real head, has its cost and acceptance):

1. prompts: the demo workloads' requests (runtime/demo_pair.py: support replies, summaries, code,
   business mail, stories), as ChatML turns or raw text, and the default golden set's prompts; the
   smoke set's prompts (where acceptance is measured) are left out;
2. text: the target continues each prompt, greedily or sampled (temperature TEMPERATURE), up to
   NEW_TOKENS tokens, to its end-of-turn token;
3. features: one forward of the target over each prompt + continuation gives the head's aux states
   (the inputs of AUX_LAYER_IDS, half precision) and its greedy token after each position;
4. training: demo_heads.train_eagle3_head over windows of those sequences (StoredFeatures), the
   draft vocabulary the DRAFT_VOCAB most frequent ids of the generated text (d2t), a one-cycle
   schedule planned for the whole budget; at each CPU-minute checkpoint acceptance on the smoke set
   (our runtime, greedy, the engines' schedule) is measured, and training stops when it gained less
   than FLAT since the last one, or at the budget.

Built once: cached under $SPECREG_ENGINE_CACHE/real-head/KEY, KEY over the recipe's functions here
and the trainer's (demo_heads), the settings and the target's weights (its fingerprint), so a second build (another demo
folder, a fresh clone) copies it. Torch runs $SPECREG_THREADS threads, else THREADS; the stamp
records CPU-seconds.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import random
import shutil
import time
from pathlib import Path

AUX_LAYER_IDS = (1, 14, 27)  # low / middle / high of 30 layers, not vLLM's default (2, 15, 27)
DRAFT_VOCAB = 8192
PROMPTS = 224  # workload requests, beside the default golden set's
NEW_TOKENS = 96
TEMPERATURE = 0.7  # every second prompt sampled, the others greedy
GENERATION_BATCH = 16
WINDOW, BATCH = 48, 8  # training windows of the stored sequences
LR = 2e-3
TTT_STEPS = 3
BUDGET_CPU_MIN = 60
CHECKPOINTS_CPU_MIN = (5, 10, 20, 30, 45, 60)
FLAT = 0.01  # alpha gained since the last checkpoint below this: stop
CPU_S_PER_STEP = 1.2  # measured on 2 threads: plans the schedule's length for the budget
THREADS = 2
K = 4
SEED = 7


def settings() -> dict:
    return dict(aux=AUX_LAYER_IDS, vocab=DRAFT_VOCAB, prompts=PROMPTS, new_tokens=NEW_TOKENS,
                temperature=TEMPERATURE, window=WINDOW, batch=BATCH, lr=LR, ttt=TTT_STEPS,
                budget=BUDGET_CPU_MIN, checkpoints=CHECKPOINTS_CPU_MIN, flat=FLAT, per_step=CPU_S_PER_STEP,
                threads=THREADS, k=K, seed=SEED)


def cache_key(target_fingerprint: str, prompt_records, eval_records) -> str:
    from importlib.metadata import version

    from specreg.builders import demo_heads

    # the recipe's code, not the files' (their docstrings and neighbours change without changing it)
    digest = hashlib.sha256()
    for function in (training_prompts, generate_text, stored_features, smoke_acceptance, _train,
                     demo_heads.StoredFeatures, demo_heads.train_eagle3_head, demo_heads.frequent_tokens):
        digest.update(inspect.getsource(function).encode())
    digest.update(json.dumps({**settings(), "target": target_fingerprint,
                              "prompts": [record.to_dict() for record in prompt_records],
                              "measured_on": [record.to_dict() for record in eval_records],
                              "libraries": {name: version(name) for name in ("torch", "transformers")}},
                             sort_keys=True, default=str).encode())
    return digest.hexdigest()[:16]


def training_prompts(tokenizer, prompt_records, eval_records, count: int = PROMPTS,
                     seed: int = SEED) -> list[list[int]]:
    """Token ids of the prompts the target continues: `count` demo workload requests (60 % as a
    ChatML user turn, the rest raw text) and prompt_records' (golden records: the default set), none
    of eval_records' (the smoke set, where acceptance is measured)."""
    from specreg.builders.demo_pair import WORKLOADS, code

    held_out = {record.render(tokenizer, True) for record in eval_records}
    rng = random.Random(seed)
    prompts = []
    for index in range(count):
        workload = WORKLOADS[index % len(WORKLOADS)]
        request, _ = workload(rng)
        if workload is not code and rng.random() < 0.6:
            text = tokenizer.apply_chat_template([{"role": "user", "content": request}], tokenize=False,
                                                 add_generation_prompt=True)
        else:
            text = request if workload is code else f"{request}\n"
        if text not in held_out:
            prompts.append(list(tokenizer.encode(text, add_special_tokens=False)))
    for record in prompt_records:
        if record.render(tokenizer, True) not in held_out:
            prompts.append(record.encode(tokenizer))
    return prompts


def generate_text(target, tokenizer, prompts: list[list[int]], *, new_tokens: int = NEW_TOKENS,
                  batch_size: int = GENERATION_BATCH, seed: int = SEED, log=None) -> list[list[int]]:
    """Each prompt continued by the target (even ones greedily, odd ones sampled at TEMPERATURE) up
    to `new_tokens` or its end-of-turn token -> prompt + continuation ids per prompt."""
    import torch

    eos = target.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos]) | {tokenizer.eos_token_id}
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    torch.manual_seed(seed)
    sequences: list[list[int]] = []
    for sampled in (False, True):
        group = prompts[int(sampled)::2]
        for start in range(0, len(group), batch_size):
            chunk = group[start:start + batch_size]
            width = max(map(len, chunk))
            ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
            with torch.no_grad():
                out = target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens,
                                      do_sample=sampled, temperature=TEMPERATURE if sampled else None,
                                      top_p=None, top_k=None, pad_token_id=pad)
            for prompt, row in zip(chunk, out[:, width:].tolist()):
                cut = next((i + 1 for i, token in enumerate(row) if token in eos), len(row))
                sequences.append(prompt + row[:cut])
            if log:
                log(f"generated {len(sequences)} of {len(prompts)} continuations")
    return sequences


def stored_features(target, sequences: list[list[int]], aux_layer_ids, window: int = WINDOW):
    """One forward of the target per sequence -> demo_heads.StoredFeatures (aux states in half
    precision, the target's greedy token after each position)."""
    import torch

    from specreg.builders.demo_heads import StoredFeatures

    tokens, aux, labels = [], [], []
    for ids in sequences:
        batch = torch.tensor([ids])
        with torch.no_grad():
            output = target(input_ids=batch, output_hidden_states=True)
        tokens.append(batch[0])
        aux.append(torch.cat([output.hidden_states[i][0] for i in aux_layer_ids], dim=-1).half())
        labels.append(output.logits[0, 1:].argmax(dim=-1))
    return StoredFeatures(tokens, aux, labels, window)


def smoke_acceptance(target, tokenizer, head, eval_records, k: int = K) -> dict:
    """Greedy acceptance of the head on eval_records (golden records: the smoke set), our runtime on
    the engines' schedule."""
    from specreg.runtime.decode_config import DecodeConfig
    from specreg.runtime.generate import speculative_generate
    from specreg.runtime.pair import ModelPair

    pair = ModelPair(target=target, tokenizer=tokenizer, draft=head,
                     vocab_size=int(target.get_output_embeddings().weight.shape[0]))
    drafted = accepted = steps = 0
    for record in eval_records:
        metrics = speculative_generate(pair, record.encode(tokenizer), DecodeConfig(
            method="eagle3", k=k, max_new_tokens=record.max_new_tokens, prefill_alone=True)).metrics
        drafted, accepted, steps = drafted + metrics.drafted, accepted + metrics.accepted, steps + metrics.draft_steps
    return {"alpha": round(accepted / drafted, 4) if drafted else None,
            "tau": round(1 + accepted / steps, 3) if steps else None, "drafted": drafted}


def build_real(directory, target_dir, prompt_records, eval_records, *, force: bool = False,
                    cached_only: bool = False, log=None,
                    budget_cpu_min: float = BUDGET_CPU_MIN, checkpoints=CHECKPOINTS_CPU_MIN,
                    prompts: int = PROMPTS, new_tokens: int = NEW_TOKENS, cache=None) -> Path | None:
    """The real pair's EAGLE-3 head -> directory / "eagle3" (a speculators-format head), copied from
    the cache (default $SPECREG_ENGINE_CACHE/real-head) or built into it first (under an exclusive
    lock: two builds train once). cached_only: None when the cache does not hold it, instead of
    building. prompt_records / eval_records: golden records the target continues / acceptance is
    measured on (the default and smoke sets; the front door loads them). The smaller budgets and
    prompt counts are for tests; they are part of the key."""
    import fcntl

    from specreg.core.digests import sha256_file
    from specreg.core.packages import cache_dir, cache_root

    target_dir = Path(target_dir)
    weights = sorted(target_dir.glob("*.safetensors"))
    fingerprint = hashlib.sha256("".join(sha256_file(p) for p in weights).encode()).hexdigest()
    key = cache_key(fingerprint, prompt_records, eval_records)
    if (budget_cpu_min, tuple(checkpoints), prompts, new_tokens) != (BUDGET_CPU_MIN, CHECKPOINTS_CPU_MIN,
                                                                     PROMPTS, NEW_TOKENS):
        key = hashlib.sha256(f"{key}{budget_cpu_min}{tuple(checkpoints)}{prompts}{new_tokens}".encode()).hexdigest()[:16]
    cached = Path(cache or cache_root() / "real-head") / key
    out = Path(directory) / "eagle3"
    if not force and _built(cached, key):
        return _copy(cached, out)
    if cached_only:
        return None
    cache_dir(cached.parent)
    with open(cached.parent / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if force or not _built(cached, key):
            _train(cached, key, target_dir, log, budget_cpu_min, tuple(checkpoints), prompts, new_tokens,
                   list(prompt_records), list(eval_records))
    return _copy(cached, out)


def _built(folder: Path, key: str) -> bool:
    stamp = folder / "real-head.json"
    return stamp.is_file() and json.loads(stamp.read_text()).get("cache_key") == key \
        and (folder / "model.safetensors").is_file()


def _copy(cached: Path, out: Path) -> Path:
    if not _built(out, json.loads((cached / "real-head.json").read_text())["cache_key"]):
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(cached, out)
    return out


def _train(folder: Path, key: str, target_dir: Path, log, budget_cpu_min, checkpoints, prompt_count, new_tokens,
           prompt_records, eval_records):
    import torch

    from specreg.builders.demo_heads import frequent_tokens, train_eagle3_head
    from specreg.runtime.methods.eagle3 import new_eagle3_head, save_eagle3_head
    from specreg.runtime.loading import load_model, load_tokenizer
    from specreg.runtime.process import explicit_threads, prepare_process

    prepare_process()  # idle OpenMP threads sleep (the CLI did it already; a library caller may not have)
    torch.set_num_threads(explicit_threads() or THREADS)
    say = log or (lambda message: None)
    cpu_started, started = time.process_time(), time.perf_counter()
    tokenizer, target = load_tokenizer(target_dir), load_model(target_dir)
    target.eval()
    for parameter in target.parameters():
        parameter.requires_grad_(False)
    prompts = training_prompts(tokenizer, prompt_records, eval_records, prompt_count)
    sequences = generate_text(target, tokenizer, prompts, new_tokens=new_tokens, log=say)
    generation_cpu = time.process_time() - cpu_started
    say(f"generated {sum(map(len, sequences))} tokens in {len(sequences)} sequences ({generation_cpu:.0f} CPU-s)")
    features = stored_features(target, sequences, AUX_LAYER_IDS)
    stream = torch.tensor([token for ids in sequences for token in ids])
    head = new_eagle3_head(target, frequent_tokens(stream, min(DRAFT_VOCAB, int(stream.max()) + 1)),
                           aux_layer_ids=AUX_LAYER_IDS, seed=SEED)
    features_cpu = time.process_time() - cpu_started - generation_cpu
    say(f"features of {len(features.tokens)} sequences ({features_cpu:.0f} CPU-s); training up to "
        f"{budget_cpu_min} CPU-min")
    table, spent, eval_cpu = [], 0.0, 0.0
    train_started = time.process_time()
    steps = max(1, int(budget_cpu_min * 60 / CPU_S_PER_STEP))
    marks = list(checkpoints)

    def checkpoint(step: int):
        nonlocal eval_cpu
        trained = time.process_time() - train_started - eval_cpu
        if not marks or (trained < marks[0] * 60 and step < steps):
            return True
        while marks and trained >= marks[0] * 60:
            marks.pop(0)
        measuring = time.process_time()
        figures = smoke_acceptance(target, tokenizer, head.eval(), eval_records)
        head.train()
        eval_cpu += time.process_time() - measuring
        table.append({"train_cpu_s": round(trained, 1), "steps": step, **figures})
        say(f"{trained / 60:.1f} CPU-min, step {step}: alpha {figures['alpha']}, tau {figures['tau']}")
        flat = len(table) >= 2 and figures["alpha"] is not None and table[-2]["alpha"] is not None \
            and figures["alpha"] - table[-2]["alpha"] < FLAT
        return not flat and trained < budget_cpu_min * 60

    train_eagle3_head(head, target, features, steps, BATCH, seed=SEED, max_lr=LR, ttt_steps=TTT_STEPS,
                      checkpoint=checkpoint)
    if not table:  # a budget under the first checkpoint
        table.append({"train_cpu_s": round(time.process_time() - train_started - eval_cpu, 1), "steps": steps,
                      **smoke_acceptance(target, tokenizer, head.eval(), eval_records)})
    save_eagle3_head(head.eval(), folder, str(target_dir.resolve()), target.config.architectures or [],
                     speculative_tokens=K)
    (folder / "real-head.json").write_text(json.dumps(
        {"cache_key": key, "settings": settings(), "generated_tokens": sum(map(len, sequences)),
         "sequences": len(sequences), "generation_cpu_s": round(generation_cpu, 1),
         "features_cpu_s": round(features_cpu, 1), "planned_steps": steps, "checkpoints": table,
         "build_cpu_s": round(time.process_time() - cpu_started, 1),
         "build_wall_s": round(time.perf_counter() - started, 1)}, indent=2))

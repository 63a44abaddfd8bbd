"""`Registry.validate` end to end on tiny pairs: each check's pass and fail path, the state
move, the persisted run and the baselines."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from specreg.errors import GoldenSetError, NotFoundError, UsageError
from specreg.registry.store.entities import PairState

from helpers import copy_model  # tests/ is on sys.path (tests/conftest.py)



FAST = "integrity,tokenizer,chat_template,equivalence,acceptance"


def statuses(outcome) -> dict[str, str]:
    return {check.name: check.status for check in outcome.checks}


def test_good_pair_passes_every_check_and_is_validated(registry, models, golden_path):
    registry.register("good", target=str(models["target"]), draft=str(models["draft"]), num_speculative_tokens=3)
    outcome = registry.validate("good@1", golden=str(golden_path), device="cpu", gpu_memory="1GiB",
                                distribution_samples=2000)
    found = statuses(outcome)
    assert list(found) == ["integrity", "tokenizer", "chat_template", "memory", "equivalence", "distribution",
                           "acceptance", "performance"]
    assert all(status in ("pass", "warn") for status in found.values()), outcome.checks
    assert found["equivalence"] == "pass" and found["distribution"] == "pass"
    assert outcome.passed and outcome.version.state is PairState.VALIDATED
    run = registry.validation_runs("good@1")[-1]
    assert run.status == "passed" and run.golden_set == "tiny" and len(run.golden_sha256) == 64
    assert run.environment["device"] == "cpu" and run.environment["torch"] and run.environment["transformers"]
    assert [c.name for c in run.checks] == list(found)
    baselines = registry.baselines("good@1")
    assert set(baselines["per_category"]) == {"support", "code", "creative"}
    assert 0 <= baselines["overall"]["acceptance_rate"] <= 1
    performance = next(c for c in run.checks if c.name == "performance").figures
    assert performance["latency_p50_ms"] <= performance["latency_p95_ms"] <= performance["latency_p99_ms"]
    assert 1 <= performance["recommended_k"] <= 8
    assert performance["decode_speedup"] > 0 and performance["speedup"] > 0
    # the cores other work kept busy during the batched passes, read from the CPUs' counters
    assert performance["other_work_cores"] >= 0.0
    assert run.summary["performance"]["other_work_cores"] == performance["other_work_cores"]
    # what the best k is expected to give goes with the run, for a refused promote to say whether any k helps
    assert run.summary["performance"]["expected_speedup_at_recommended_k"] == \
        performance["expected_speedup_at_recommended_k"] > 0
    event = registry.history("good")[-1]
    assert event.action == "validate" and event.to_state == "validated"
    assert event.details["validation_run_id"] == run.id


def test_weights_are_read_once_ahead_of_the_checks(registry, models, golden_path, monkeypatch):
    """Each weight file of the target and the draft model is read from disk once, on the
    read-ahead thread, while the first checks run; the integrity check and the load use that
    read (digests.read_ahead). A validation that loads no model reads nothing ahead."""
    import threading

    from specreg.core import digests

    reads = []
    real_read = digests.read_now
    monkeypatch.setattr(digests, "read_now", lambda path: reads.append(
        (Path(path).parent.name, Path(path).name, threading.current_thread().name)) or real_read(path))
    registry.register("ahead", target=str(models["target"]), draft=str(models["draft"]), num_speculative_tokens=3)
    outcome = registry.validate("ahead@1", golden=str(golden_path), device="cpu", checks="integrity,equivalence")
    assert statuses(outcome) == {"integrity": "pass", "equivalence": "pass"}
    names = [(Path(models[which]).name, "model.safetensors", "specreg-read-ahead_0") for which in ("target", "draft")]
    assert reads == names and digests._READ_AHEAD == {}
    reads.clear()
    registry.validate("ahead@1", golden=str(golden_path), device="cpu", checks="integrity,tokenizer")
    assert reads == []


def test_each_tokenizer_is_built_once_per_validation(registry, models, golden_path, monkeypatch):
    """The tokenizers the checks load (checked against the fingerprints) serve the runtime too
    (loading.shared_tokenizers): the target's and the draft's own (AutoTokenizer's pick, the
    target's class here, so it is also the draft read as the engine reads it) are built once each;
    a second validation builds again."""
    from specreg.runtime import loading

    built = []
    real_build = loading._load_tokenizer_from
    monkeypatch.setattr(loading, "_load_tokenizer_from", lambda directory, path, tokenizer_class=None: built.append(
        (Path(path).name, tokenizer_class is not None)) or real_build(directory, path, tokenizer_class))
    registry.register("shared", target=str(models["target"]), draft=str(models["draft"]), num_speculative_tokens=3)
    checks = "tokenizer,chat_template,equivalence"
    outcome = registry.validate("shared@1", golden=str(golden_path), device="cpu", checks=checks)
    assert statuses(outcome) == {"tokenizer": "pass", "chat_template": "pass", "equivalence": "pass"}
    target, draft = Path(models["target"]).name, Path(models["draft"]).name
    assert sorted(built) == sorted([(target, False), (draft, False)])
    assert loading._SHARED_TOKENIZERS is None
    built.clear()
    registry.validate("shared@1", golden=str(golden_path), device="cpu", checks="equivalence")
    assert sorted(built) == sorted([(target, False), (draft, True)])


def test_self_draft_accepts_everything_then_random_draft_drops_against_its_baseline(registry, models, golden_path):
    registry.register("drop", target=str(models["target"]), draft=str(models["self"]), num_speculative_tokens=3)
    # the sampled record's drafts drawn from q = p are all accepted (greedy drafting: p(argmax) of them)
    first = registry.validate("drop@1", golden=str(golden_path), device="cpu", checks="equivalence,acceptance",
                              draft_sampling="probabilistic")
    overall = registry.baselines("drop@1")["overall"]
    assert first.passed and overall["acceptance_rate"] == pytest.approx(1.0)
    assert overall["mean_acceptance_length"] > 2.5  # k + 1 = 4 except where max_new_tokens cuts a step short
    # recorded as the engines count it: tau over draft steps, vLLM's unconditional per-position rate;
    # ours beside it (the first forward of each prompt is the prefill, which verifies drafts here)
    assert registry.baselines("drop@1")["tau_definition"] == "engines"
    assert overall["mean_acceptance_length"] == pytest.approx(1 + overall["accepted"] / overall["draft_steps"])
    assert overall["per_position_acceptance"][0] == 1.0 and overall["per_position_acceptance_conditional"][0] == 1.0
    assert overall["tokens_per_target_forward"] <= overall["mean_acceptance_length"]

    registry.register("drop", target=str(models["target"]), draft=str(models["draft"]), num_speculative_tokens=3)
    second = registry.validate("drop@2", golden=str(golden_path), device="cpu", checks="equivalence,acceptance",
                               draft_sampling="probabilistic")
    acceptance = next(c for c in second.checks if c.name == "acceptance")
    assert acceptance.status == "fail" and "below v1's" in acceptance.summary
    assert acceptance.evidence["compared_with_version"] == 1
    assert any(not row["ok"] and row["scope"] == "overall" for row in acceptance.evidence["comparison"])
    assert not second.passed and second.version.state is PairState.FAILED
    assert registry.baselines("drop@2") is None  # a failed run sets no baselines


def test_swapped_token_id_fails_tokenizer_and_runtime_refuses(registry, models, golden_path, tmp_path):
    draft = copy_model(models["draft"], tmp_path / "swapped")
    data = json.loads((draft / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    a, b = sorted(token for token in vocab if len(token) > 2)[:2]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (draft / "tokenizer.json").write_text(json.dumps(data))
    registry.register("swap", target=str(models["target"]), draft=str(draft), num_speculative_tokens=3)
    outcome = registry.validate("swap@1", golden=str(golden_path), device="cpu", checks=FAST)
    found = statuses(outcome)
    assert found["tokenizer"] == "fail" and found["equivalence"] == "fail" and found["acceptance"] == "skip"
    tokenizer = next(c for c in outcome.checks if c.name == "tokenizer")
    assert a in tokenizer.summary or b in tokenizer.summary
    assert "runtime refuses" in next(c for c in outcome.checks if c.name == "equivalence").summary
    assert outcome.version.state is PairState.FAILED


def test_extra_special_token_fails(registry, models, golden_path, tmp_path):
    from transformers import AutoTokenizer

    draft = copy_model(models["draft"], tmp_path / "extra")
    tokenizer = AutoTokenizer.from_pretrained(draft)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|tool|>"]})
    tokenizer.save_pretrained(draft)
    registry.register("extra", target=str(models["target"]), draft=str(draft), num_speculative_tokens=3)
    outcome = registry.validate("extra@1", golden=str(golden_path), device="cpu", checks="tokenizer,equivalence")
    tokenizer_check = next(c for c in outcome.checks if c.name == "tokenizer")
    # a token past the target's vocabulary alone is a warning (engines feed the draft the target's
    # ids); this one also has no embedding row in the draft, which fails
    assert tokenizer_check.status == "fail"
    assert "vocab_size 300 is smaller than its tokenizer (301 tokens)" in tokenizer_check.summary
    assert not outcome.passed


def test_chat_template_missing_newline_fails_while_runtime_checks_run(registry, models, golden_path, tmp_path):
    draft = copy_model(models["draft"], tmp_path / "template")
    template = draft / "chat_template.jinja"  # where transformers 5 saves it
    assert "<|assistant|>\n" in template.read_text()
    template.write_text(template.read_text().replace("<|assistant|>\n", "<|assistant|>"))
    registry.register("tmpl", target=str(models["target"]), draft=str(draft), num_speculative_tokens=3)
    outcome = registry.validate("tmpl@1", golden=str(golden_path), device="cpu", checks=FAST)
    found = statuses(outcome)
    assert found["chat_template"] == "fail" and found["equivalence"] == "pass"
    assert "<|assistant|>" in next(c for c in outcome.checks if c.name == "chat_template").summary
    assert outcome.version.state is PairState.FAILED


def test_padded_vocabulary_warns_but_passes(registry, models, golden_path):
    registry.register("padded", target=str(models["target"]), draft=str(models["padded"]), num_speculative_tokens=3)
    outcome = registry.validate("padded@1", golden=str(golden_path), device="cpu", checks=FAST)
    found = statuses(outcome)
    assert found["tokenizer"] == "warn" and found["equivalence"] == "pass"
    assert outcome.passed and outcome.version.state is PairState.VALIDATED


def test_weights_modified_after_registration_fail_integrity_naming_the_file(registry, models, golden_path, tmp_path):
    from safetensors.torch import load_file, save_file

    draft = copy_model(models["draft"], tmp_path / "tampered")
    registry.register("tamper", target=str(models["target"]), draft=str(draft), num_speculative_tokens=3)
    weights = load_file(draft / "model.safetensors")
    name = sorted(weights)[0]
    weights[name] = weights[name] + 0.01
    save_file(weights, draft / "model.safetensors", metadata={"format": "pt"})
    outcome = registry.validate("tamper@1", golden=str(golden_path), device="cpu", checks="integrity")
    integrity = outcome.checks[0]
    assert integrity.status == "fail" and "model.safetensors" in integrity.summary and str(draft) in integrity.summary
    assert outcome.version.state is PairState.FAILED


def test_corrupt_weights_fail_the_check_that_reads_them(registry, models, golden_path, tmp_path):
    # an exception inside one check is that check's failure, never the run's abort
    draft = copy_model(models["draft"], tmp_path / "corrupt")
    registry.register("corrupt", target=str(models["target"]), draft=str(draft), num_speculative_tokens=3)
    (draft / "model.safetensors").write_bytes(b"\x00" * 64)
    outcome = registry.validate("corrupt@1", golden=str(golden_path), device="cpu", checks="memory")
    memory = outcome.checks[0]
    assert memory.status == "fail" and "model.safetensors" in memory.summary and "\n" not in memory.summary
    run = registry.validation_runs("corrupt@1")[-1]
    assert run.status == "failed" and run.error is None
    assert registry.get("corrupt@1").state is PairState.FAILED


def test_user_errors_before_any_run(registry, models, golden_path, tmp_path):
    with pytest.raises(NotFoundError, match="unknown pair nope"):
        registry.validate("nope@1", golden=str(golden_path))
    registry.register("errs", target=str(models["target"]), draft=str(models["draft"]), num_speculative_tokens=3)
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nversion: 1\nrecords:\n  - id: a\n    category: x\n    max_new_tokens: 4\n")
    with pytest.raises(GoldenSetError, match="bad.yaml"):
        registry.validate("errs@1", golden=str(bad))
    from specreg.errors import UsageError

    with pytest.raises(UsageError, match="unknown check 'speed'"):
        registry.validate("errs@1", golden=str(golden_path), checks="speed")
    assert registry.validation_runs("errs@1") == []
    assert registry.get("errs@1").state is PairState.REGISTERED


def test_ngram_pair_validates_without_a_draft_model(registry, models, golden_path):
    registry.register("lookup", target=str(models["target"]), method="ngram", num_speculative_tokens=3,
                      prompt_lookup_max=3)
    outcome = registry.validate("lookup@1", golden=str(golden_path), device="cpu", gpu_memory="1GiB",
                                checks="integrity,tokenizer,chat_template,memory,equivalence,acceptance")
    found = statuses(outcome)
    assert found == {"integrity": "pass", "tokenizer": "skip", "chat_template": "skip", "memory": "pass",
                     "equivalence": "pass", "acceptance": "pass"}
    memory = next(c for c in outcome.checks if c.name == "memory").figures
    assert memory["draft_weight_bytes"] == 0 and memory["target_weight_bytes"] > 0
    assert outcome.passed and outcome.version.state is PairState.VALIDATED
    assert registry.baselines("lookup@1")["overall"]["drafted"] >= 0


def test_batched_validation_counts_what_one_prompt_at_a_time_counts(registry, models, golden_path):
    """`validate` decodes the golden prompts batched (--runtime-batch) on the engines' schedule:
    the same tokens and counts as one at a time, the batch size recorded with the speed figures,
    and each prompt's greedy decode kept for `validate --engine llamacpp` (reused_rows)."""
    from specreg.engine_validation.runtime_rows import golden_prompts, reused_rows
    from specreg.golden_prompts.loader import load_golden_set
    from specreg.runtime.loading import load_tokenizer

    registry.register("batched", target=str(models["target"]), draft=str(models["draft"]), num_speculative_tokens=3)
    checks = "equivalence,acceptance,performance"
    runs = {}
    for batch in (1, 3):
        outcome = registry.validate("batched@1", golden=str(golden_path), device="cpu", checks=checks,
                                    runtime_batch=batch)
        assert outcome.passed, outcome.checks
        runs[batch] = outcome.run
    one, three = (next(c for c in runs[b].checks if c.name == "acceptance") for b in (1, 3))
    assert one.evidence["greedy_rows"] == three.evidence["greedy_rows"]
    for scope in ("overall",):
        for key in ("drafted", "accepted", "draft_steps", "per_position_acceptance", "generated_tokens"):
            assert one.evidence["baselines"][scope][key] == three.evidence["baselines"][scope][key], key
    assert three.evidence["baselines"]["schedule"] == "prefill_alone"
    performance = {b: next(c for c in runs[b].checks if c.name == "performance").figures for b in (1, 3)}
    assert performance[1]["batch_size"] == 1 and performance[3]["batch_size"] == 3
    # latency at batch 1: the 3-prompt set decodes one prompt again alone; at batch 1 all of them are
    assert performance[3]["latency_prompts"] == 1 and performance[1]["latency_prompts"] == 3
    assert performance[3]["batch1_tokens_per_s"] > 0
    # the engine comparison reads these decodes instead of decoding again ...
    golden = load_golden_set(str(golden_path))
    prompts, _ = golden_prompts(golden, load_tokenizer(models["target"]))
    rows = reused_rows(runs[3], golden, prompts, "float32")
    assert [row["record"] for row in rows] == ["chat-1", "raw-1", "sampled-1"]
    assert rows[0]["token_ids"] == three.evidence["greedy_rows"][0]["token_ids"]
    # the very rows the engine comparison's own runtime pass decodes when there is no such run
    from specreg.engine_validation.runtime_rows import runtime_pass
    from specreg.runtime.methods import load_pair

    pair = load_pair(models["target"], models["draft"], device="cpu")
    assert runtime_pass(pair, prompts, registry.get("batched@1"), batch_size=2) == rows
    # ... but not those of another dtype, nor a run recorded before validate used the engines' schedule
    assert reused_rows(runs[3], golden, prompts, "bfloat16") is None
    older = dataclasses.replace(runs[3], baselines={key: value for key, value in runs[3].baselines.items()
                                                    if key != "schedule"})
    assert reused_rows(older, golden, prompts, "float32") is None


def test_validate_takes_golden_set_and_tolerance_from_the_policy_and_says_which(models, golden_path, tmp_path,
                                                                                monkeypatch):
    from clirun import run

    from policyrecord import record_policy

    policy = tmp_path / "team.toml"
    policy.write_text(f'golden_set = "{golden_path}"\nacceptance_tolerance = 0.25\n'
                      '[environments.staging]\n[environments.production]\nacceptance_tolerance = 0.2\n')
    db = f"sqlite:///{tmp_path / 'registry.db'}"
    version = record_policy(db, policy, tmp_path)
    assert run("register", "pol", "--target", models["target"], "--draft", models["draft"], "-k", "3",
               "--db", db).returncode == 0
    result = run("validate", "pol@1", "--device", "cpu", "--checks", "integrity,tokenizer", "--db", db)
    assert result.returncode == 0, result.stderr
    # the policy's last environment (production) decides, and the run says which policy that was
    assert result.stdout.splitlines()[-2:] == [
        "pol@1: validation run 1 passed on golden set tiny; state validated",
        f"golden set and acceptance tolerance (20%) from policy of record v{version}, environment production"]
    explicit = run("validate", "pol@1", "--device", "cpu", "--checks", "integrity", "--golden", "smoke",
                   "--acceptance-tolerance", "0.3", "--db", db, "--json")
    data = json.loads(explicit.stdout)
    assert data["golden_set"] == "smoke" and data["acceptance_tolerance"] == 0.3 and data["policy"] is None
    from specreg.api import Registry

    runs = {run.id: run for run in Registry(db).validation_runs("pol@1")}
    assert runs[1].golden_set == "tiny" and runs[1].options["acceptance_tolerance"] == 0.2
    assert runs[2].golden_set == "smoke" and runs[2].options["acceptance_tolerance"] == 0.3


def test_validate_records_how_sampled_records_drafted(registry, models, golden_path, tmp_path):
    """`validate --draft-sampling`: sampled records draft the argmax with a point-mass q (greedy, the
    engines' default and validate's) or from q (probabilistic); the run's options and baselines
    record which, and the greedy records' figures are the same either way."""
    registry.register("drafting", target=str(models["target"]), draft=str(models["draft"]), num_speculative_tokens=3)
    runs = {mode: registry.validate("drafting@1", golden=str(golden_path), device="cpu", checks="acceptance",
                                    **({"draft_sampling": mode} if mode else {})).run
            for mode in (None, "greedy", "probabilistic")}
    for mode, run in runs.items():
        assert run.options["draft_sampling"] == run.baselines["draft_sampling"] == (mode or "greedy")
        assert run.summary["settings"]["draft_sampling"] == (mode or "greedy")
    greedy, probabilistic = (runs[mode].baselines["per_category"] for mode in ("greedy", "probabilistic"))
    assert greedy["support"] == probabilistic["support"] and greedy["code"] == probabilistic["code"]
    assert runs[None].baselines == runs["greedy"].baselines
    # a golden set of greedy records only: both ways draft the argmax, nothing to record
    greedy_only = tmp_path / "greedy.yaml"
    greedy_only.write_text(golden_path.read_text().split("  - id: sampled-1")[0])
    run = registry.validate("drafting@1", golden=str(greedy_only), device="cpu", checks="acceptance",
                            draft_sampling="probabilistic").run
    assert run.options["draft_sampling"] == "probabilistic" and run.baselines["draft_sampling"] is None


def test_an_unknown_draft_sampling_is_a_usage_error(registry, models, golden_path, tmp_path):
    from clirun import run

    result = run("validate", "any@1", "--golden", str(golden_path), "--draft-sampling", "top1",
                 "--db", f"sqlite:///{tmp_path / 'registry.db'}")
    assert result.returncode == 2
    assert "Invalid value for '--draft-sampling': 'top1' is not one of 'greedy', 'probabilistic'." in result.stderr
    with pytest.raises(UsageError, match="invalid draft sampling 'top1': use one of greedy, probabilistic"):
        registry.validate("any@1", golden=str(golden_path), device="cpu", draft_sampling="top1")


def test_a_baseline_drafted_the_other_way_is_flagged_when_compared(registry, models, golden_path):
    from specreg.core.baselines import draft_sampling_note

    for k in (3, 2):
        registry.register("other-way", target=str(models["target"]), draft=str(models["draft"]),
                          num_speculative_tokens=k)
    registry.validate("other-way@1", golden=str(golden_path), device="cpu", checks="acceptance",
                      draft_sampling="probabilistic", acceptance_tolerance=0.9)
    second = registry.validate("other-way@2", golden=str(golden_path), device="cpu", checks="acceptance",
                               acceptance_tolerance=0.9)
    acceptance = second.checks[0]
    note = ("v1's baseline's sampled records drafted probabilistic, this run's greedy: the sampled categories' "
            "figures moved with the draft sampling too; validate both the same way to compare them")
    assert acceptance.evidence["notes"] == [note] and acceptance.summary.endswith(note)
    # recorded the same way, or not recorded on one side: nothing to flag
    assert draft_sampling_note({"draft_sampling": "greedy"}, {"draft_sampling": "greedy"}) is None
    assert draft_sampling_note({"draft_sampling": "greedy"}, {}) is None

"""Wrong validation verdicts: pairs that
are fine must pass, runs that measured nothing must not, and one broken check must not take the
others down. Real tiny models (tests/tinymodels.py), the real suite, real processes for the CLI.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from specreg.api import Registry
from specreg.errors import PolicyViolation
from pgroles import as_user
from policyrecord import record_policy

from clirun import SPECREG, run  # tests/ is on sys.path (tests/conftest.py)

GOLDEN_YAML = """
name: verdicts
version: 1
records:
  - id: chat-1
    category: support
    messages:
      - {role: user, content: "hello world, this is a tiny corpus"}
    max_new_tokens: 12
  - id: raw-1
    category: code
    prompt: "def add(a, b):\\n"
    max_new_tokens: 12
"""


@pytest.fixture(scope="module")
def golden(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("golden") / "verdicts.yaml"
    path.write_text(GOLDEN_YAML)
    return path


@pytest.fixture(scope="module")
def models(models, tiny_models, tmp_path_factory) -> dict[str, Path]:
    """tests/conftest.py's ``models`` (a Llama target, a draft, a copy of the target that accepts
    every token) with a GPT-2 and a Qwen2 draft over the target's tokenizer files. ``plain``: a
    Llama target whose tokenizer_config names no unk/pad token (as many real ones), with a Qwen2 draft over the same files (``plain_qwen2``)
    and one whose tokenizer files differ (``plain_qwen2_other``: one token renamed)."""
    from tinymodels import build_llama, build_other

    root = tmp_path_factory.mktemp("verdict-models")
    target = tiny_models["target"]
    plain_tokenizer = Path(shutil.copytree(tiny_models["tokenizer"], root / "plain-tokenizer"))
    config = json.loads((plain_tokenizer / "tokenizer_config.json").read_text())
    for key in ("unk_token", "pad_token"):
        config.pop(key, None)
    (plain_tokenizer / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    plain = build_llama(root / "plain", plain_tokenizer, seed=1, hidden_size=96)
    for name in ("tokenizer.json", "tokenizer_config.json"):  # byte-identical to the draft's copies
        shutil.copyfile(plain_tokenizer / name, plain / name)
    other = Path(shutil.copytree(plain_tokenizer, root / "other-tokenizer"))
    data = json.loads((other / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    victim = next(token for token, token_id in vocab.items() if token_id == 200)
    vocab["zz-renamed"] = vocab.pop(victim)
    (other / "tokenizer.json").write_text(json.dumps(data))
    return {
        **models,
        "gpt2": build_other(root / "gpt2", target, "gpt2", seed=2),
        "qwen2": build_other(root / "qwen2", target, "qwen2", seed=2),
        "plain": plain,
        "plain_qwen2": build_other(root / "plain-qwen2", plain, "qwen2", seed=2),
        "plain_qwen2_other": build_other(root / "plain-qwen2-other", other, "qwen2", seed=2),
    }


def statuses(outcome) -> dict[str, str]:
    return {check.name: check.status for check in outcome.checks}


# --- GPT-2 draft: sizes through the config attribute map -----------------------------------------

def test_gpt2_draft_memory_check_reads_n_layer(models):
    from specreg.validators.memory import check_memory_headroom

    result = check_memory_headroom(models["gpt2"], models["target"], gpu_memory="1GiB", dtype="float32")
    assert result.status == "pass", result.summary
    draft_cache = result.evidence["models"]["draft"]["kv_cache"]
    # GPT-2 says n_layer=2, n_head=4, n_embd=64: 2 layers x 4 heads x 16 dims, 512 positions (target's)
    assert (draft_cache["layers"], draft_cache["kv_heads"], draft_cache["head_dim"]) == (2, 4, 16)
    assert result.figures["draft_kv_cache_bytes"] == 2 * 2 * 4 * 16 * 4 * 512


def test_gpt2_draft_validates_on_the_cli(db_url, models, golden):
    registry = Registry(as_user(db_url, "alice"), user="alice")
    registry.register("gpt2", target=str(models["target"]), draft=str(models["gpt2"]), num_speculative_tokens=3)
    result = run("validate", "gpt2@1", "--golden", golden, "--device", "cpu", "--gpu-memory", "1GiB",
                 "--checks", "integrity,tokenizer,chat_template,memory", "--db", db_url, "--json")
    assert result.returncode == 0, result.stderr
    found = {c["name"]: c["status"] for c in json.loads(result.stdout)["checks"]}
    assert found == {"integrity": "pass", "tokenizer": "pass", "chat_template": "pass", "memory": "pass"}


def test_an_exception_inside_one_check_fails_that_check_only(db_url, models, golden, tmp_path):
    broken = Path(shutil.copytree(models["gpt2"], tmp_path / "broken"))
    config = json.loads((broken / "config.json").read_text())
    config["n_head"] = 0  # no attention heads: the memory check cannot size a KV cache
    (broken / "config.json").write_text(json.dumps(config))
    registry = Registry(as_user(db_url, "alice"), user="alice")
    registry.register("broken", target=str(models["target"]), draft=str(broken), num_speculative_tokens=3)
    outcome = registry.validate("broken@1", golden=str(golden), device="cpu", gpu_memory="1GiB",
                                checks="integrity,tokenizer,memory")
    found = statuses(outcome)
    assert found == {"integrity": "pass", "tokenizer": "pass", "memory": "fail"}, outcome.checks
    memory = next(c for c in outcome.checks if c.name == "memory")
    assert "n_head" in memory.summary or "num_attention_heads" in memory.summary
    assert memory.evidence["error"]["type"]
    assert outcome.run.status == "failed" and outcome.version.state.value == "failed"


# --- Qwen2 draft: what the engine uses, the loader difference as a warning ----------------------

def test_qwen2_draft_with_identical_tokenizer_files_warns_not_fails(models, golden):
    from specreg.golden_prompts.loader import load_golden_set
    from specreg.runtime.loading import load_tokenizer
    from specreg.validators.tokenizer import check_tokenizer_alignment

    # transformers builds a Qwen2Tokenizer from the draft's model_type and adds '<|endoftext|>'
    assert len(load_tokenizer(models["plain_qwen2"])) == len(load_tokenizer(models["plain"])) + 1
    result = check_tokenizer_alignment(models["plain_qwen2"], models["plain"], load_golden_set(str(golden)))
    assert result.status == "warn", result.summary
    loader = [f for f in result.evidence["findings"] if f["aspect"] == "loader"]
    assert len(loader) == 1 and "Qwen2Tokenizer" in loader[0]["message"] and "<|endoftext|>" in loader[0]["message"]
    assert all(f["status"] == "warn" for f in result.evidence["findings"])


def test_qwen2_draft_is_read_twice_where_autotokenizer_picks_another_class(models, golden):
    """Inside a validation the draft's own build serves as its reading with the target's class only
    when AutoTokenizer picked that class; here it picks Qwen2Tokenizer, so the engine's reading is
    a build of its own, and the check's findings are those of the check loading them itself."""
    from specreg.core.fingerprint import fingerprint_model
    from specreg.golden_prompts.loader import load_golden_set
    from specreg.runtime.loading import shared_tokenizers
    from specreg.validators.tokenizer import check_tokenizer_alignment, load_pair_tokenizers

    with shared_tokenizers():
        loaded = load_pair_tokenizers(models["plain_qwen2"], models["plain"],
                                      draft_expected=fingerprint_model(models["plain_qwen2"]),
                                      target_expected=fingerprint_model(models["plain"]))
    own, draft, target = loaded["draft_own_tokenizer"], loaded["draft_tokenizer"], loaded["target_tokenizer"]
    assert type(own).__name__ == "Qwen2Tokenizer" and type(draft) is type(target) is not type(own)
    assert len(own) == len(draft) + 1 and draft.get_vocab() == target.get_vocab()
    golden_set = load_golden_set(str(golden))
    shared = check_tokenizer_alignment(models["plain_qwen2"], models["plain"], golden_set, **loaded)
    alone = check_tokenizer_alignment(models["plain_qwen2"], models["plain"], golden_set)
    assert (shared.status, shared.summary, shared.evidence) == (alone.status, alone.summary, alone.evidence)


def test_qwen2_draft_with_different_tokenizer_files_still_fails(models):
    from specreg.validators.tokenizer import check_tokenizer_alignment

    result = check_tokenizer_alignment(models["plain_qwen2_other"], models["plain"])
    assert result.status == "fail"
    assert any(f["status"] == "fail" and "zz-renamed" in f["message"] for f in result.evidence["findings"])


def test_qwen2_draft_runs_through_the_runtime(db_url, models, golden):
    registry = Registry(as_user(db_url, "alice"), user="alice")
    registry.register("qwen", target=str(models["plain"]), draft=str(models["plain_qwen2"]), num_speculative_tokens=3)
    outcome = registry.validate("qwen@1", golden=str(golden), device="cpu",
                                checks="tokenizer,equivalence,acceptance")
    found = statuses(outcome)
    assert found == {"tokenizer": "warn", "equivalence": "pass", "acceptance": "pass"}, outcome.checks
    assert outcome.passed


# --- item 10: a run where every check skipped is not a pass --------------------------------------

def test_a_run_that_checked_nothing_is_not_passed(db_url, models, golden, approval_key):
    alice = Registry(as_user(db_url, "alice"), user="alice")
    alice.register("skips", target=str(models["target"]), draft=str(models["self"]), num_speculative_tokens=3)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(SPECREG + ["validate", "skips@1", "--golden", str(golden), "--device", "cpu",
                                       "--checks", "memory", "--db", db_url],
                            capture_output=True, text=True, timeout=300, env=env)
    assert "Traceback" not in result.stderr
    assert result.returncode == 100, (result.stdout, result.stderr)
    # one error line; the lines before it are the run's first line and the progress of each check
    # (plain lines off a terminal)
    [error] = [line for line in result.stderr.splitlines() if line.startswith("specreg:")]
    assert "no check ran" in error and result.stderr.splitlines()[-1] == error
    first, *progress = result.stderr.splitlines()[:-1]
    assert first.startswith("validation run 1 of skips@1: "), first
    assert progress and all(line.startswith("check memory: ") for line in progress), progress
    run_row = alice.validation_runs("skips@1")[-1]
    assert run_row.status == "failed" and [c.status for c in run_row.checks] == ["skip"]
    assert alice.get("skips@1").state.value != "validated"
    with pytest.raises(PolicyViolation, match="has not passed validation"):
        Registry(as_user(db_url, "bob"), user="bob").approve("skips@1", key=approval_key(db_url, "bob"))


# --- item 11: acceptance compared only at the same k ---------------------------------------------

def test_tau_is_compared_only_at_the_same_k(db_url, models, golden, tmp_path, monkeypatch):
    policy = tmp_path / "specreg.toml"
    policy.write_text(f'golden_set = "{golden}"\nrequired_checks = ["acceptance"]\n\n'
                      "[environments.staging]\napproval_required = false\n")
    record_policy(db_url, policy, tmp_path)
    alice = Registry(as_user(db_url, "alice"), user="alice")
    for k in (4, 3):  # the same perfect pair (draft == target) at two depths
        alice.register("depth", target=str(models["target"]), draft=str(models["self"]), num_speculative_tokens=k)
    first = alice.validate("depth@1", golden=str(golden), device="cpu", checks="acceptance")
    assert first.passed and alice.baselines("depth@1")["k"] == 4
    alice.promote("depth@1", "staging")
    second = alice.validate("depth@2", golden=str(golden), device="cpu", checks="acceptance")
    acceptance = second.checks[0]
    assert acceptance.status == "pass", acceptance.summary
    compared = {(row["scope"], row["metric"]) for row in acceptance.evidence["comparison"]}
    assert ("overall", "acceptance_rate") in compared and ("overall", "mean_acceptance_length") not in compared
    assert "k=4" in " ".join(acceptance.evidence["not_compared"])
    assert acceptance.evidence["notes"] == []  # both counted on the engines' schedule: nothing to flag
    gate = alice.gate("depth@2", "staging")
    condition = next(c for c in gate.conditions if c.name == "acceptance")
    assert condition.passed, condition.reason
    assert {row["figure"] for row in condition.details["compared"]} == {"acceptance_rate"}
    assert condition.details["notes"] == []


def test_a_drop_at_the_same_k_still_fails(db_url, models, golden):
    alice = Registry(as_user(db_url, "alice"), user="alice")
    alice.register("same-k", target=str(models["target"]), draft=str(models["self"]), num_speculative_tokens=3)
    alice.register("same-k", target=str(models["target"]), draft=str(models["draft"]), num_speculative_tokens=3)
    assert alice.validate("same-k@1", golden=str(golden), device="cpu", checks="acceptance").passed
    second = alice.validate("same-k@2", golden=str(golden), device="cpu", checks="acceptance")
    assert second.checks[0].status == "fail"
    assert {row["metric"] for row in second.checks[0].evidence["comparison"]} == {"acceptance_rate",
                                                                                  "mean_acceptance_length"}


# --- choose_k never recommends past the measured depth silently ----------------------------------

def test_recommended_k_stays_within_the_measured_positions(models, golden):
    from specreg.golden_prompts.loader import load_golden_set
    from specreg.runtime.decode_config import DecodeConfig
    from specreg.runtime.methods import load_pair
    from specreg.validators import equivalence
    from specreg.validators.performance import check_performance

    pair = load_pair(models["target"], models["self"], device="cpu")
    settings = DecodeConfig(method="draft_model", k=4, prompt_lookup_min=1, prompt_lookup_max=3)
    decodes = equivalence.decode_golden(pair, load_golden_set(str(golden)), settings, seed=0)
    # every draft token accepted and drafting free: any deeper k looks better by extrapolation
    result = check_performance(pair, decodes, method="draft_model", k=4, k_max=12, cost_ratio=0.0)
    assert result.figures["measured_positions"] == 4
    assert result.figures["recommended_k"] == 4
    assert result.figures["extrapolated_k"] == 12
    assert "extrapolated" in result.summary and "k=12" in result.summary


# --- a check that could not run is an error, never a fail -----------------------

def pickle_copy(source: Path, destination: Path) -> Path:
    """The model in ``source`` with its weights as a PyTorch pickle (pytorch_model.bin, as
    torch.save writes it) instead of safetensors."""
    import torch
    from safetensors.torch import load_file

    destination = Path(shutil.copytree(source, destination, ignore=shutil.ignore_patterns("*.safetensors")))
    torch.save(load_file(source / "model.safetensors"), destination / "pytorch_model.bin")
    return destination


def test_a_pickle_pair_registered_with_allow_pickle_is_validated(db_url, models, golden, tmp_path):
    target = pickle_copy(models["target"], tmp_path / "target-bin")
    draft = pickle_copy(models["draft"], tmp_path / "draft-bin")
    run("register", "pkl", "--target", target, "--draft", draft, "-k", "3", "--allow-pickle", "--db", db_url)
    result = run("validate", "pkl@1", "--golden", golden, "--device", "cpu", "--gpu-memory", "1GiB",
                 "--checks", "integrity,memory,equivalence", "--db", db_url, "--json")
    found = {c["name"]: (c["status"], c["summary"]) for c in json.loads(result.stdout)["checks"]}
    assert {name: status for name, (status, _) in found.items()} == \
        {"integrity": "pass", "memory": "pass", "equivalence": "pass"}, found
    assert result.returncode == 0, result.stderr
    # the same figures as the safetensors pair: the pickle was read, not guessed
    registry = Registry(as_user(db_url, "alice"), user="alice")
    registry.register("st", target=str(models["target"]), draft=str(models["draft"]), num_speculative_tokens=3)
    same = registry.validate("st@1", golden=str(golden), device="cpu", gpu_memory="1GiB",
                             checks="integrity,memory,equivalence")
    memory = next(c for c in same.checks if c.name == "memory")
    assert json.loads(result.stdout)["checks"][1]["figures"] == memory.figures


def test_a_pickle_file_is_read_with_weights_only(models, tmp_path):
    """A .bin that would run code when unpickled is refused with a one-line reason, not run."""
    import pickle

    from specreg.core.fingerprint import fingerprint_model
    from specreg.runtime.loading import load_model
    from specreg.errors import ModelReferenceError

    target = pickle_copy(models["target"], tmp_path / "evil")
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    (target / "pytorch_model.bin").write_bytes(pickle.dumps({"x": Evil()}))
    expected = fingerprint_model(target, allow_pickle=True)
    with pytest.raises(ModelReferenceError, match="pytorch_model.bin: cannot load"):
        load_model(target, "cpu", "float32", expected=expected)
    assert not marker.exists()


def test_a_check_that_could_not_run_is_an_error_not_a_fail(db_url, models, golden):
    """A check that raises (here the runtime's greedy rule breaks mid-decode) records "error": the
    run is an error and the pair's state does not move to failed (the CLI's exit 1 for it)."""
    registry = Registry(as_user(db_url, "alice"), user="alice")
    registry.register("err", target=str(models["target"]), draft=str(models["draft"]), num_speculative_tokens=3)

    def broken_rule(*args, **kwargs):
        raise ZeroDivisionError("division by zero")

    outcome = registry.validate("err@1", golden=str(golden), device="cpu", checks="integrity,equivalence,acceptance",
                                hooks={"greedy_rule": broken_rule})
    assert statuses(outcome) == {"integrity": "pass", "equivalence": "error", "acceptance": "skip"}, outcome.checks
    equivalence = next(c for c in outcome.checks if c.name == "equivalence")
    assert equivalence.summary == "the check could not run: the runtime stopped on this pair: division by zero"
    assert outcome.run.status == "error" and outcome.version.state.value == "registered"
    assert not outcome.passed

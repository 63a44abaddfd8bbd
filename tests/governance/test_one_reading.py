"""One command, one reading: the golden set is resolved once, where a command starts, and the gate
matches validation runs by its content hash; the policy of record is read once a command, however
many of its parts judge by it."""

from __future__ import annotations

import functools
import json

import pytest
from govstate import POLICY_TOML, record_validation, register_versions

import clirun  # tests/ is on sys.path (tests/conftest.py)
from pgroles import as_user
from policyrecord import record_policy
from specreg.api import Registry
from specreg.golden_prompts.loader import load_golden_set
from specreg.golden_prompts.records import GoldenRef

run = functools.partial(clirun.run, user="alice")
SMOKE = load_golden_set("smoke").content_sha256
NOT_JUDGED = "not judged: needs a passed validation on golden set smoke"
# two greedy prompts: a real validation by `gate --rerun` takes seconds on the tiny models
GOLDEN_YAML = """\
name: once
version: 1
records:
  - {id: code-01, category: code, prompt: "def add(a, b):", max_new_tokens: 12}
  - {id: chat-01, category: support, messages: [{role: user, content: "how do i reset my password?"}], max_new_tokens: 12}
"""


def conditions(result) -> dict[str, tuple[bool, str]]:
    return {c.name: (c.passed, c.reason) for c in result.conditions}


@pytest.fixture
def policy_reads(monkeypatch):
    """Each reading of the policy of record, counted: a spy on policy_record.policy_of_record, the
    one function that replays it from the store's audit chain (the real one still answers)."""
    from specreg.registry.governance import policy_record

    reads = []
    real = policy_record.policy_of_record

    def counted(store):
        reads.append(store.url)
        return real(store)

    monkeypatch.setattr(policy_record, "policy_of_record", counted)
    return reads


def test_the_gate_judges_the_run_on_the_sets_content_not_the_newest_under_its_name(db_url, tiny_models, policy_file):
    alice = Registry(as_user(db_url, "alice"), user="alice")
    (ref,) = register_versions(alice, tiny_models, "hashed", 1)
    matching = record_validation(alice, ref)
    newer = record_validation(alice, ref, golden_sha256="f" * 64)  # recorded as smoke, but other prompts
    gate = alice.gate(ref, "staging")
    assert gate.passed, gate.reasons
    assert gate.validation_run_id == matching < newer
    assert conditions(gate)["validation"] == (True, f"run {matching} passed on smoke")
    assert conditions(gate)["golden_set"] == (True, f"same golden set hash {SMOKE[:12]}")


def test_a_run_on_the_set_before_it_changed_is_the_cause_and_nothing_is_judged_on_it(db_url, tiny_models,
                                                                                      policy_file):
    alice = Registry(as_user(db_url, "alice"), user="alice")
    (ref,) = register_versions(alice, tiny_models, "changed", 1)
    stale = record_validation(alice, ref, golden_sha256="f" * 64, checks={"integrity": "fail"})
    gate = alice.gate(ref, "staging")
    assert gate.reasons == [f"golden_set: golden set smoke changed since run {stale} "
                            f"(ffffffffffff -> {SMOKE[:12]}): validate again"]
    assert gate.validation_run_id == stale
    # its failed integrity check was measured on other prompts: not judged, so not listed as unmet
    assert conditions(gate)["check.integrity"] == (False, NOT_JUDGED)
    assert conditions(gate)["baselines"] == (False, NOT_JUDGED)


def test_a_policy_naming_a_golden_file_matches_runs_by_the_files_content(tmp_path, tiny_models):
    golden = tmp_path / "sets" / "once.yaml"
    golden.parent.mkdir()
    golden.write_text(GOLDEN_YAML)
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY_TOML.replace('golden_set = "smoke"', f'golden_set = "{golden}"'))
    db_url = f"sqlite:///{tmp_path / 'registry.db'}"
    record_policy(db_url, policy, tmp_path)
    alice = Registry(db_url, user="alice")
    first, second = register_versions(alice, tiny_models, "filed", 2)
    loaded = load_golden_set(str(golden))
    assert loaded.reference == GoldenRef("once", str(golden), loaded.content_sha256)
    # a run records the set's own name, never the path the policy names it by
    matched = record_validation(alice, first, golden="once", golden_sha256=loaded.content_sha256)
    assert alice.gate(first, "staging").validation_run_id == matched and alice.gate(first, "staging").passed
    earlier = record_validation(alice, second, golden="once", golden_sha256="e" * 64)
    assert alice.gate(second, "staging").reasons == [
        f"golden_set: golden set {golden} changed since run {earlier} (eeeeeeeeeeee -> "
        f"{loaded.content_sha256[:12]}): validate again"]


def test_each_command_reads_the_policy_of_record_once(tmp_path, tiny_models, approval_key, policy_reads):
    db_url = f"sqlite:///{tmp_path / 'registry.db'}"
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY_TOML)
    record_policy(db_url, policy, tmp_path)
    alice = Registry(db_url, user="alice")
    first, second = register_versions(alice, tiny_models, "once", 2)
    record_validation(alice, first)
    record_validation(alice, second, acceptance_rate=0.5)

    def reads_of(*args) -> tuple[int, int]:
        policy_reads.clear()
        result = run(*args, "--db", db_url)
        return result.returncode, len(policy_reads)

    # refused: the reasons' fixes name who may approve, from the keyring the same policy enrols
    assert reads_of("gate", first, "--env", "production") == (100, 1)
    assert reads_of("promote", first, "--to", "production") == (100, 1)
    assert reads_of("gate", first, "--env", "staging") == (0, 1)
    assert reads_of("promote", first, "--to", "staging") == (0, 1)
    # the approval standing, which engine baseline counts and the lock's approval policy
    assert reads_of("export", first, "--format", "vllm", "--force") == (0, 1)
    assert reads_of("validate", second, "--golden", "smoke", "--checks", "integrity", "--device", "cpu") == (0, 1)


def test_a_policy_changed_while_the_gate_reruns_is_not_read_again(tmp_path, tiny_models, policy_reads):
    golden = tmp_path / "once.yaml"
    golden.write_text(GOLDEN_YAML)
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY_TOML.replace('golden_set = "smoke"', f'golden_set = "{golden}"'))
    db_url = f"sqlite:///{tmp_path / 'registry.db'}"
    first = record_policy(db_url, policy, tmp_path)
    alice = Registry(db_url, user="alice")
    (ref,) = register_versions(alice, tiny_models, "moving", 1)
    changed = tmp_path / "changed.toml"
    changed.write_text(policy.read_text().replace("acceptance_tolerance = 0.10", "acceptance_tolerance = 0.25"))
    recorded = []

    def change_the_policy(*_):  # the rerun's progress: the policy of record moves on mid-command
        if not recorded:
            before = len(policy_reads)
            recorded.append(record_policy(db_url, changed, tmp_path))
            del policy_reads[before:]  # the proposer's and approver's own commands read it too

    policy_reads.clear()
    result = alice.gate(ref, "staging", rerun=True, progress=change_the_policy)
    assert len(policy_reads) == 1
    assert recorded == [first + 1] and Registry(db_url).policy().version == first + 1
    assert result.passed, result.reasons
    assert result.policy_version == first
    [run_row] = alice.validation_runs(ref)
    assert run_row.options["acceptance_tolerance"] == 0.10  # the rerun judged under what the gate read


def test_a_golden_file_changed_while_the_gate_reruns_is_caught_by_the_next_command(tmp_path, tiny_models):
    golden = tmp_path / "once.yaml"
    golden.write_text(GOLDEN_YAML)
    resolved = load_golden_set(str(golden)).content_sha256
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY_TOML.replace('golden_set = "smoke"', f'golden_set = "{golden}"'))
    db_url = f"sqlite:///{tmp_path / 'registry.db'}"
    record_policy(db_url, policy, tmp_path)
    alice = Registry(db_url, user="alice")
    (ref,) = register_versions(alice, tiny_models, "edited", 1)

    def edit_the_golden_file(*_):  # the rerun's progress: someone edits the set mid-command
        golden.write_text(GOLDEN_YAML.replace("id: code-01", "id: code-02"))

    result = alice.gate(ref, "staging", rerun=True, progress=edit_the_golden_file)
    edited = load_golden_set(str(golden)).content_sha256
    assert edited != resolved
    # the run records the content it decoded, resolved once; the gate judged that same content
    [run_row] = alice.validation_runs(ref)
    assert run_row.golden_set == "once" and run_row.golden_sha256 == resolved
    acceptance = next(c for c in run_row.checks if c.name == "acceptance")
    assert [row["record"] for row in acceptance.evidence["greedy_rows"]] == ["code-01", "chat-01"]
    assert result.passed and conditions(result)["golden_set"] == (True, f"same golden set hash {resolved[:12]}")
    # the next command resolves the file as it is now: the run no longer counts
    assert alice.gate(ref, "staging").reasons == [
        f"golden_set: golden set {golden} changed since run {run_row.id} ({resolved[:12]} -> {edited[:12]}): "
        "validate again"]

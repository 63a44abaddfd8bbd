"""The deploy tests' shared state: a validated, approved, promoted pair exported with a signed
lock (``deployed``), as tests/deploy/test_pair_lock.py and the pipeline tests use it."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from specreg.api import Registry
from specreg.registry.deploy.lock import LOCK_FILE

sys.path.insert(0, str(Path(__file__).parent.parent / "governance"))
from govstate import POLICY_TOML, record_validation  # noqa: E402

from clirun import run  # tests/ is on sys.path (tests/conftest.py)
from policyrecord import record_policy


@pytest.fixture
def keys(tmp_path):
    result = run("keys", "create", "--out", tmp_path / "keys")
    assert result.returncode == 0, result.stderr
    return tmp_path / "keys" / "specreg-signing.key", tmp_path / "keys" / "specreg-signing.pub"


@pytest.fixture
def deployed(tmp_path, tiny_models, keys, approval_key):
    """lock@1 registered from copies of the tiny models (so a test may tamper with them),
    validated (recorded rows), approved by bob, promoted to staging and exported with a signed
    lock. Returns the paths a deploy has."""
    target, draft = tmp_path / "models" / "target", tmp_path / "models" / "draft"
    shutil.copytree(tiny_models["target"], target)
    shutil.copytree(tiny_models["draft"], draft)
    db = f"sqlite:///{tmp_path / 'registry.db'}"
    policy = tmp_path / "specreg.toml"
    policy.write_text(POLICY_TOML)
    record_policy(db, policy, tmp_path)  # the policy of record: the smoke golden set
    alice = Registry(db, user="alice")
    alice.register("lock", target=str(target), draft=str(draft), num_speculative_tokens=3)
    record_validation(alice, "lock@1", acceptance_rate=0.8, mean_acceptance_length=3.0)
    Registry(db, user="bob").approve("lock@1", key=approval_key(db, "bob"), note="checked")
    keyring = tmp_path / "approvers.json"  # what the platform mounts beside the public key
    assert run("keys", "export", "--out", keyring, "--db", db).returncode == 0
    alice.promote("lock@1", "staging", reason="first rollout")
    out = tmp_path / "out"
    result = run("export", "lock@staging", "--format", "vllm", "-o", out, "--db", db,
                 env={"SPECREG_SIGNING_KEY": str(keys[0])})
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # signed: no warning
    return {"db": db, "target": target, "draft": draft, "lock": out / LOCK_FILE, "private": keys[0],
            "public": keys[1], "tmp": tmp_path, "keyring": keyring, "out": out}



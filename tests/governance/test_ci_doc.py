"""docs/ci.md stays true: its policy block is the built-in default, and the gate commands of
its GitHub Actions and GitLab CI jobs run as written against a real registry."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml
from govstate import record_validation, register_versions

from pgroles import as_user
from policyrecord import record_policy
from specreg.api import Registry
from specreg.registry.governance.policy import DEFAULT_POLICY_TOML

DOC = Path(__file__).parents[2] / "docs" / "ci.md"


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC.read_text(), re.S)


def test_policy_block_is_the_built_in_default():
    assert [tomllib.loads(b) for b in blocks("toml")] == [tomllib.loads(DEFAULT_POLICY_TOML)]


def test_documented_gate_commands_run(tmp_path, tiny_models, policy_file):
    github, gitlab = (yaml.safe_load(b) for b in blocks("yaml"))
    github_gate = next(s["run"] for s in github["jobs"]["gate"]["steps"] if s.get("name") == "specreg gate")
    gitlab_gate = gitlab["specreg-gate"]["script"][0]
    assert gitlab["specreg-gate"]["artifacts"]["reports"]["junit"] == "gate.xml"

    db_url = f"sqlite:///{tmp_path / 'registry.db'}"
    record_policy(db_url, policy_file, tmp_path)
    registry = Registry(as_user(db_url, "alice"), user="alice")
    (ref,) = register_versions(registry, tiny_models, "chat", 1)
    record_validation(registry, ref)
    summary = tmp_path / "step-summary.md"
    github_cmd = github_gate.replace("${{ inputs.pair }}", ref).replace("${{ inputs.environment }}", "staging")
    env = {**os.environ, "SPECREG_DB": db_url, "GITHUB_STEP_SUMMARY": str(summary), "PAIR": ref,
           "TARGET_ENV": "staging", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    for command in (github_cmd, gitlab_gate):
        workdir = tmp_path / ("github" if command is github_cmd else "gitlab")
        workdir.mkdir()
        result = subprocess.run(["bash", "-euc", command], cwd=workdir, env=env, capture_output=True, text=True,
                                timeout=120)
        assert result.returncode == 0, (command, result.stderr)
        assert json.loads((workdir / "gate.json").read_text())["verdict"] == "pass"
        assert (workdir / "gate.xml").read_text().count("<testcase") >= 5
    assert "PASS" in summary.read_text() and "PASS" in (tmp_path / "gitlab" / "gate.md").read_text()

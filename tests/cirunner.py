"""How CI runners read and run what this repository ships for them (action.yml, the GitLab
template in ci/): their output file formats, a composite action's `run:` steps as a runner runs
them, a GitLab job with its `extends` resolved. Used by tests/deploy/test_pipeline.py and
tests/governance/test_ci_doc.py."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
ACTION = yaml.safe_load((ROOT / "action.yml").read_text())
GITLAB_TEMPLATE = yaml.safe_load((ROOT / "ci" / "specreg-gate.gitlab-ci.yml").read_text())


def gitlab_job(name: str) -> dict:
    """A job of the GitLab template with its `extends` resolved as GitLab does: mappings merged
    key by key, anything else (script lines, lists) replaced."""
    def merge(base, override):
        if isinstance(base, dict) and isinstance(override, dict):
            return {**base, **{key: merge(base.get(key), value) for key, value in override.items()}}
        return override
    job = dict(GITLAB_TEMPLATE[name])
    parent = job.pop("extends", None)
    return merge(gitlab_job(parent), job) if parent else job


def parse_github_output(text: str) -> dict[str, str]:
    """$GITHUB_OUTPUT as the runner reads it: `name=value`, or `name<<DELIMITER` ... `DELIMITER`."""
    outputs, lines = {}, iter(text.splitlines())
    for line in lines:
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            name, delimiter = line.split("<<", 1)
            value = []
            for body in lines:
                if body == delimiter:
                    break
                value.append(body)
            else:
                raise AssertionError(f"{name}: delimiter {delimiter} never closes")
            outputs[name] = "\n".join(value)
        elif line:
            name, value = line.split("=", 1)
            outputs[name] = value
    return outputs


def parse_dotenv(text: str) -> dict[str, str]:
    """A GitLab dotenv report, held to GitLab's rules: one NAME=value a line, ASCII names, no
    empty lines, comments or quotes, under 5 KiB and 20 variables."""
    assert len(text.encode()) < 5 * 1024
    lines = text.splitlines()
    assert 0 < len(lines) <= 20 and all(lines)
    pairs = [line.split("=", 1) for line in lines]
    assert all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) for name, _ in pairs)
    assert not any(value[:1] in ("'", '"') for _, value in pairs)
    return dict(pairs)


def step_env(step: dict, inputs: dict[str, str], defaults: dict[str, dict]) -> dict[str, str]:
    """A step's `env:` with its `${{ inputs.NAME }}` expressions filled in as the runner does."""
    def value(match):
        name = match.group(1)
        return inputs.get(name, defaults[name].get("default", ""))
    return {key: re.sub(r"\$\{\{\s*inputs\.([\w-]+)\s*\}\}", value, str(text)) for key, text in step.get("env", {}).items()}


def run_action_step(name: str, inputs: dict[str, str], runner: dict[str, Path], env: dict[str, str],
                    cwd: Path | None = None):
    """One `run:` step of action.yml as a runner runs a composite step: bash --noprofile --norc
    -eo pipefail on the script, the step's env, $GITHUB_PATH's lines before PATH; ``cwd``: the
    workspace (default this process's)."""
    step = next(s for s in ACTION["runs"]["steps"] if s["name"] == name)
    assert step["shell"] == "bash" and "${{" not in step["run"]  # inputs reach a script only via env
    path_lines = runner["GITHUB_PATH"].read_text().splitlines() if runner["GITHUB_PATH"].exists() else []
    script = runner["RUNNER_TEMP"] / f"step-{re.sub(r'[^a-z]+', '-', name)}.sh"
    script.write_text(step["run"])
    full = {**env, **{k: str(v) for k, v in runner.items()}, **step_env(step, inputs, ACTION["inputs"]),
            "PATH": os.pathsep.join([*reversed(path_lines), env["PATH"]])}
    return subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)], env=full, cwd=cwd,
                          capture_output=True, text=True, timeout=900)

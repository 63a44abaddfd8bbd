"""The gate where pipelines live, run as the pipelines run it: the `gate` extra installed in a fresh
venv by action.yml's own install step (no torch, transformers or MLflow there), the action's gate
step with $GITHUB_OUTPUT / $GITHUB_STEP_SUMMARY / $GITHUB_PATH files as a runner provides them,
the GitLab template's script lines, and the Containerfile's RUN lines building the verify image's
venv; each against the registry and signed lock of the ``deployed`` fixture (tests/deploy/conftest.py).

The installs reach the package index (a wheel cache under $SPECREG_ENGINE_CACHE keeps later runs
quick), hence ``slow``; the output formats' own tests below are not."""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cirunner import ACTION, gitlab_job, parse_dotenv, parse_github_output, run_action_step  # tests/ is on sys.path
from specreg.api import Registry
from specreg.ci_formats import STEP_SUMMARY_LIMIT, SUMMARY_CUT_NOTE, dotenv, gate_outputs, github_output, step_summary

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "mlflow")
GITLAB = gitlab_job(".specreg-gate")


def clean_env(**extra) -> dict[str, str]:
    """This test process's environment without its venv: a pipeline's shell has only its own."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    own_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if p != own_bin)
    from specreg.core.packages import cache_root

    env["PIP_CACHE_DIR"] = str(cache_root() / "pip")  # wheels kept between runs (HOME is per test)
    return {**env, **extra}


# --- the source a pipeline installs: the files of a clean clone -----------------------------------

@pytest.fixture(scope="session")
def source_tree(tmp_path_factory) -> Path:
    """The repository's files as a clean clone has them (tracked and untracked-not-ignored), less
    what .dockerignore keeps out of the image: what action.yml and the Containerfile install."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split("\0")
    ignored = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    source = tmp_path_factory.mktemp("clone") / "specreg"
    for name in filter(None, listed):
        if dockerignored(name, ignored) or not (ROOT / name).is_file():
            continue
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, source / name)
    return source


@pytest.fixture(scope="session")
def gate_venv(source_tree, tmp_path_factory) -> dict[str, Path]:
    """The runner state after action.yml's install step (default inputs): its venv's bin folder
    on $GITHUB_PATH. Fails when that venv can import torch, transformers or MLflow."""
    runner_temp = tmp_path_factory.mktemp("runner")
    runner = {"RUNNER_TEMP": runner_temp, "GITHUB_PATH": runner_temp / "github_path",
              "GITHUB_ACTION_PATH": source_tree}
    installed = run_action_step("install specreg[gate]", {}, runner, clean_env())
    assert installed.returncode == 0, installed.stdout + installed.stderr
    (bin_dir,) = runner["GITHUB_PATH"].read_text().splitlines()
    for module in HEAVY:
        probe = subprocess.run([f"{bin_dir}/python", "-c", f"import {module}"], capture_output=True, text=True)
        assert probe.returncode != 0 and "ModuleNotFoundError" in probe.stderr, (module, probe.stderr)
    return {**runner, "bin": Path(bin_dir)}


def runner_files(tmp_path: Path, gate_venv: dict[str, Path]) -> dict[str, Path]:
    """A fresh job's files (the install step's $GITHUB_PATH kept: the same job, a later step)."""
    files = {"RUNNER_TEMP": tmp_path / "runner", "GITHUB_OUTPUT": tmp_path / "github_output",
             "GITHUB_STEP_SUMMARY": tmp_path / "step_summary.md", "GITHUB_PATH": gate_venv["GITHUB_PATH"],
             "GITHUB_ACTION_PATH": gate_venv["GITHUB_ACTION_PATH"]}
    files["RUNNER_TEMP"].mkdir()
    for name in ("GITHUB_OUTPUT", "GITHUB_STEP_SUMMARY"):
        files[name].touch()  # the runner creates both before the step
    return files


# --- the gate extra in a venv of its own ----------------------------------------------------------

def heavy_modules(python, args: list, env: dict[str, str], cwd: Path) -> list[str]:
    """The torch, transformers and MLflow modules `specreg ARGS` imported, run by ``python``."""
    probe = ("import sys, runpy; sys.argv = ['specreg', *sys.argv[1:]]\n"
             "try: runpy.run_module('specreg.cli', run_name='__main__')\n"
             "except SystemExit: pass\n"
             f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))")
    # cwd: not the checkout, whose specreg/ folder `-c` would put first on sys.path
    ran = subprocess.run([str(python), "-c", probe, *map(str, args)], env=env, capture_output=True, text=True,
                         timeout=300, cwd=cwd)
    lines = ran.stdout.strip().splitlines()
    assert lines, ran.stderr
    return ast.literal_eval(lines[-1])  # the probe's last line: a list of names


def test_gate_and_verify_import_no_model_stack_even_where_it_is_installed(deployed):
    """The quick check of the same property in this venv (torch installed): gate, verify and the
    export of a manifest import none of torch, transformers, MLflow."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    db, tmp = deployed["db"], deployed["tmp"]
    assert heavy_modules(sys.executable, ["gate", "lock@1", "--env", "staging", "--db", db, "--json"], env, tmp) == []
    assert heavy_modules(sys.executable, ["verify", "--lock", deployed["lock"], "--public-key", deployed["public"],
                                          "--keyring", deployed["keyring"], "--target", deployed["target"],
                                          "--draft", deployed["draft"], "--json"], env, tmp) == []
    assert heavy_modules(sys.executable, ["export", "lock@staging", "--format", "argo-analysis", "--db", db,
                                          "-o", tmp / "argo-out"], env, tmp) == []
    assert (tmp / "argo-out" / "argo-analysis.yaml").is_file()  # the export ran, not only imported

@pytest.mark.slow
def test_gate_extra_runs_gate_and_verify_without_torch(gate_venv, deployed):
    env = clean_env(PATH=f"{gate_venv['bin']}{os.pathsep}{clean_env()['PATH']}")
    assert shutil.which("specreg", path=env["PATH"]) == str(gate_venv["bin"] / "specreg")
    gate = subprocess.run(["specreg", "gate", "lock@1", "--env", "staging", "--db", deployed["db"], "--json"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert gate.returncode == 0, gate.stderr
    assert json.loads(gate.stdout)["verdict"] == "pass"
    verify = subprocess.run(["specreg", "verify", "--lock", deployed["lock"], "--public-key", deployed["public"],
                             "--keyring", deployed["keyring"], "--target", deployed["target"], "--draft",
                             deployed["draft"], "--registry", deployed["db"], "--env", "staging"],
                            env=env, capture_output=True, text=True, timeout=300)
    assert verify.returncode == 0, verify.stderr
    assert "verified lock@1: signed lock, files match" in verify.stdout
    # what gate loaded: none of the model or MLflow stack
    assert heavy_modules(gate_venv["bin"] / "python", ["gate", "lock@1", "--env", "production", "--db",
                                                       deployed["db"], "--json"], env, deployed["tmp"]) == []
    # promote (a deploy job's) works on, its MLflow mirror skipped with a warning, not an error
    promote = subprocess.run(["specreg", "promote", "lock@1", "--to", "production", "--reason", "pipeline",
                              "--db", deployed["db"]], env={**env, "SPECREG_MLFLOW": "on"}, capture_output=True,
                             text=True, timeout=300)
    assert promote.returncode == 0, promote.stderr
    assert "MLflow is not installed: no MLflow mirror" in promote.stderr
    assert Registry(deployed["db"]).get("lock@production").version == 1
    # a command that runs models says which extra it needs, in one line
    validate = subprocess.run(["specreg", "validate", "lock@1", "--db", deployed["db"]], env=env,
                              capture_output=True, text=True, timeout=300)
    assert validate.returncode == 1 and validate.stderr.count("\n") == 1, validate.stderr
    assert "pip install 'specreg[validate]'" in validate.stderr and "Traceback" not in validate.stderr


# --- action.yml -----------------------------------------------------------------------------------

@pytest.mark.slow
def test_action_writes_outputs_and_summary_on_a_pass(gate_venv, deployed, tmp_path):
    runner = runner_files(tmp_path, gate_venv)
    result = run_action_step("specreg gate", {"pair": "lock@staging", "environment": "staging",
                                              "database": deployed["db"], "lock": str(deployed["lock"])},
                             runner, clean_env())
    assert result.returncode == 0, result.stdout + result.stderr
    outputs = parse_github_output(runner["GITHUB_OUTPUT"].read_text())
    version = Registry(deployed["db"]).get("lock@1")
    assert outputs == {"verdict": "pass", "pair": "lock", "version": "1", "environment": "staging",
                       "binding": version.binding_sha256,
                       "lock_digest": hashlib.sha256(deployed["lock"].read_bytes()).hexdigest(),
                       "audit_head": Registry(deployed["db"]).store.audit_head(), "reasons": ""}
    # each action output reads a value the step writes
    for name, spec in ACTION["outputs"].items():
        assert re.fullmatch(r"\$\{\{ steps\.gate\.outputs\.(\w+) \}\}", spec["value"]).group(1) in outputs, name
    summary = runner["GITHUB_STEP_SUMMARY"].read_text()
    assert summary.startswith("## specreg gate lock@1 → staging: PASS") and "`fingerprints`" in summary
    junit = (runner["RUNNER_TEMP"] / "specreg-gate" / "gate.xml").read_text()
    assert junit.count("<testcase") >= 10


@pytest.mark.slow
def test_action_fails_the_step_on_a_refusal_with_the_reasons_as_a_multiline_output(gate_venv, deployed, tmp_path,
                                                                                     approval_key):
    Registry(deployed["db"], user="bob").reject("lock@1", "not for production",
                                                key=approval_key(deployed["db"], "bob"))
    config = deployed["target"] / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "rope_theta": 1234.0}))  # changed on disk
    runner = runner_files(tmp_path, gate_venv)
    result = run_action_step("specreg gate", {"pair": "lock@1", "environment": "production",
                                              "database": deployed["db"]}, runner, clean_env())
    assert result.returncode == 100, result.stdout + result.stderr
    text = runner["GITHUB_OUTPUT"].read_text()
    assert re.search(r"^reasons<<ghadelimiter_[0-9a-f]{32}$", text, re.M)  # the heredoc form
    outputs = parse_github_output(text)
    assert outputs["verdict"] == "refused" and outputs["lock_digest"] == ""
    reasons = outputs["reasons"].splitlines()
    assert [line.split(":")[0] for line in reasons] == ["fingerprints", "approval"], reasons
    assert "REFUSED" in runner["GITHUB_STEP_SUMMARY"].read_text().splitlines()[0]


@pytest.mark.slow
def test_action_refuses_a_lock_of_another_binding_and_reports_an_error(gate_venv, deployed, tmp_path):
    lock = json.loads(deployed["lock"].read_text())
    lock["pair"]["binding_sha256"] = "0" * 64
    other = tmp_path / "other.lock.json"
    other.write_text(json.dumps(lock))
    runner = runner_files(tmp_path, gate_venv)
    result = run_action_step("specreg gate", {"pair": "lock@1", "environment": "staging",
                                              "database": deployed["db"], "lock": str(other)}, runner, clean_env())
    assert result.returncode == 100 and "binds 000000000000, not the gated lock@1" in result.stderr
    assert "PASS" in runner["GITHUB_STEP_SUMMARY"].read_text()  # the gate itself passed: the report says so
    # an unreachable registry: the gate errs, fails closed, and still says so in its outputs
    (tmp_path / "error").mkdir()
    runner = runner_files(tmp_path / "error", gate_venv)
    result = run_action_step("specreg gate", {"pair": "lock@1", "environment": "staging",
                                              "database": f"sqlite:///{tmp_path / 'none' / 'x.db'}"},
                             runner, clean_env())
    assert result.returncode == 1, result.stdout + result.stderr
    outputs = parse_github_output(runner["GITHUB_OUTPUT"].read_text())
    assert outputs["verdict"] == "error" and outputs["reasons"]
    assert "ERROR" in runner["GITHUB_STEP_SUMMARY"].read_text()


# --- the GitLab template --------------------------------------------------------------------------

@pytest.mark.slow
def test_gitlab_template_script_runs_with_junit_and_dotenv_reports(source_tree, deployed, tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    assert GITLAB["artifacts"]["reports"] == {"junit": "gate.xml", "dotenv": "gate.env"}
    assert GITLAB["artifacts"]["when"] == "always"
    variables = {**GITLAB["variables"], "SPECREG_REQUIREMENT": f"{source_tree}[gate]",
                 "SPECREG_GATE_PAIR": "lock@1", "SPECREG_GATE_ENV": "staging",
                 "SPECREG_GATE_LOCK": str(deployed["lock"]), "SPECREG_DB": deployed["db"],
                 "CI_PROJECT_DIR": str(project)}
    # a GitLab runner runs before_script and script as one shell script, stopping at a failing line
    script = "\n".join(["set -eo pipefail", *GITLAB["before_script"], *GITLAB["script"]])
    result = subprocess.run(["bash", "-c", script], cwd=project, env=clean_env(**variables), capture_output=True,
                            text=True, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    env = parse_dotenv((project / "gate.env").read_text())
    assert env["SPECREG_VERDICT"] == "pass" and env["SPECREG_PAIR"] == "lock" and env["SPECREG_VERSION"] == "1"
    assert env["SPECREG_LOCK_DIGEST"] == hashlib.sha256(deployed["lock"].read_bytes()).hexdigest()
    assert env["SPECREG_BINDING"] == Registry(deployed["db"]).get("lock@1").binding_sha256
    assert (project / "gate.xml").read_text().count("<testcase") >= 10
    for path in GITLAB["artifacts"]["paths"]:
        assert (project / path).is_file(), path
    probe = subprocess.run([f"{project}/.specreg-venv/bin/python", "-c", "import torch"], capture_output=True)
    assert probe.returncode != 0


# --- the verify image -----------------------------------------------------------------------------

def containerfile_instructions() -> list[tuple[str, str]]:
    text = (ROOT / "Containerfile").read_text().replace("\\\n", " ")
    return [tuple(line.split(None, 1)) for line in text.splitlines() if line.strip() and not line.startswith("#")]


@pytest.mark.slow
def test_containerfile_run_lines_build_a_verify_venv_without_torch(source_tree, deployed, tmp_path):
    instructions = containerfile_instructions()
    assert ("COPY", ". /src") in instructions and ("ENV", "PATH=/opt/specreg/bin:$PATH") in instructions
    runs = [argument for kind, argument in instructions if kind == "RUN"]
    assert any('"/src[verify]"' in line for line in runs)
    image_src = tmp_path / "src"
    shutil.copytree(source_tree, image_src)  # the image's /src (the RUN line deletes it)
    venv = tmp_path / "opt-specreg"
    for line in runs:
        line = line.replace("/opt/specreg", str(venv)).replace("/src", str(image_src))
        result = subprocess.run(["bash", "-euc", line], env=clean_env(), capture_output=True, text=True, timeout=900)
        assert result.returncode == 0, (line, result.stdout + result.stderr)
    assert not image_src.exists()
    # what the Kubernetes export's initContainer runs: specreg verify on the mounted files
    verify = subprocess.run([str(venv / "bin" / "specreg"), "verify", "--lock", deployed["lock"], "--public-key",
                             deployed["public"], "--keyring", deployed["keyring"], "--target", deployed["target"],
                             "--draft", deployed["draft"]], env=clean_env(), capture_output=True, text=True,
                            timeout=300)
    assert verify.returncode == 0, verify.stderr


def test_k8s_export_names_the_image_the_containerfile_builds():
    from specreg.registry.deploy.engines import k8s

    header = (ROOT / "Containerfile").read_text()
    assert f"-t {k8s.OPTIONS['verify_image']} " in header


# --- the output formats ---------------------------------------------------------------------------

GATE = {"pair": "chat", "version": 7, "environment": "production", "verdict": "refused", "passed": False,
        "binding_sha256": "b" * 64, "audit_head": "a" * 64,
        "reasons": ["fingerprints: target weights changed", "approval: no signed approval"]}


def test_github_output_round_trips_through_the_runner_format():
    outputs = gate_outputs(GATE)
    assert parse_github_output(github_output(outputs)) == outputs
    tricky = {"reasons": "a=b\nghadelimiter_x\n\nlast", "pair": "x=y"}
    assert parse_github_output(github_output(tricky)) == tricky


def test_dotenv_keeps_gitlab_rules_and_cuts_long_reasons():
    env = parse_dotenv(dotenv(gate_outputs(GATE)))
    assert env["SPECREG_REASONS"] == "fingerprints: target weights changed; approval: no signed approval"
    many = {**GATE, "reasons": [f"check.{i}: " + "x" * 200 for i in range(100)]}
    env = parse_dotenv(dotenv(gate_outputs(many)))
    assert env["SPECREG_REASONS"].endswith("(cut; see gate.json)") and env["SPECREG_VERDICT"] == "refused"


def test_error_json_gives_verdict_error_and_the_error_as_reason():
    outputs = gate_outputs({"ref": "chat@7", "environment": "production", "passed": False, "verdict": "error",
                            "error": "unknown environment 'prod'"})
    assert outputs["verdict"] == "error" and outputs["reasons"] == "unknown environment 'prod'"


def test_step_summary_is_cut_below_one_mib_with_a_note():
    row = "| ❌ | `check.x` | " + "reason " * 20 + "|\n"
    big = "## specreg gate chat@7 → production: REFUSED\n\n" + row * (STEP_SUMMARY_LIMIT // len(row.encode()) + 50)
    cut = step_summary(big)
    assert len(cut.encode()) <= STEP_SUMMARY_LIMIT and cut.endswith(SUMMARY_CUT_NOTE)
    assert cut.startswith("## specreg gate chat@7") and (cut.removesuffix(SUMMARY_CUT_NOTE)).endswith("|\n")
    small = "## ok\n"
    assert step_summary(small) == small


def test_ci_outputs_cli_appends_a_cut_summary_and_refuses_bad_input(tmp_path):
    from clirun import run_specreg

    (tmp_path / "gate.json").write_text(json.dumps(GATE))
    (tmp_path / "gate.md").write_text("x\n" * (STEP_SUMMARY_LIMIT // 2 + 10))
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    result = run_specreg(["ci-outputs", tmp_path / "gate.json", "--style", "github", "--markdown",
                          tmp_path / "gate.md", "--summary", summary, "--output", tmp_path / "out"])
    assert result.returncode == 0, result.stderr
    assert summary.read_text().startswith("earlier step\nx\n") and summary.read_text().endswith(SUMMARY_CUT_NOTE)
    assert parse_github_output((tmp_path / "out").read_text())["verdict"] == "refused"
    (tmp_path / "bad.json").write_text("{")
    bad = run_specreg(["ci-outputs", tmp_path / "bad.json", "--style", "dotenv"])
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "bad.json" in bad.stderr


# --- the canary analysis, bound by the lock like every engine file --------------------------------

def test_argo_analysis_export_is_bound_by_the_signed_lock(deployed, tmp_path):
    from clirun import run_specreg

    out = tmp_path / "argo"
    exported = run_specreg(["export", "lock@staging", "--format", "argo-analysis", "-o", out, "--db", deployed["db"],
                            "--signing-key", deployed["private"], "--option", "analysis_engine=llamacpp"])
    assert exported.returncode == 0, exported.stderr
    lock = json.loads((out / "specreg.lock.json").read_text())
    assert lock["engine"] == {"name": "argo-rollouts", "version": "1.9", "format": "argo-analysis"}
    assert list(lock["exported"]) == ["argo-analysis.yaml"]
    args = ["verify", "--lock", out / "specreg.lock.json", "--public-key", deployed["public"], "--keyring",
            deployed["keyring"], "--target", deployed["target"], "--draft", deployed["draft"],
            "--config", out / "argo-analysis.yaml"]
    assert run_specreg(args).returncode == 0
    analysis = out / "argo-analysis.yaml"
    analysis.write_text(analysis.read_text().replace("result[0] >= 0.72", "result[0] >= 0.1"))  # a lowered floor
    refused = run_specreg(args)
    assert refused.returncode == 100 and "argo-analysis.yaml" in refused.stderr, refused.stderr


# --- step outputs a hostile gate JSON, note or lock cannot bend ----------------------------------

def test_a_lock_of_another_version_still_writes_the_outputs_as_refused(tmp_path):
    """Was: nothing written to $GITHUB_OUTPUT (nor GitLab's gate.env) when the lock bound another
    version, though docs/ci.md says the outputs are written either way."""
    from clirun import one_line, run_specreg

    gate = tmp_path / "gate.json"
    gate.write_text(json.dumps({**GATE, "verdict": "pass", "passed": True, "reasons": []}))
    lock = tmp_path / "specreg.lock.json"
    lock.write_text(json.dumps({"pair": {"binding_sha256": "c" * 64}}))
    for style, parse in (("github", parse_github_output), ("dotenv", parse_dotenv)):
        out = tmp_path / f"out.{style}"
        result = run_specreg(["ci-outputs", gate, "--style", style, "--lock", lock, "--output", out])
        one_line(result, 100, f"pair lock {lock} binds cccccccccccc, not the gated chat@7 (bbbbbbbbbbbb)")
        outputs = parse(out.read_text())
        verdict, reasons = (outputs["verdict"], outputs["reasons"]) if style == "github" else \
            (outputs["SPECREG_VERDICT"], outputs["SPECREG_REASONS"])
        assert verdict == "refused" and reasons == f"pair lock {lock} binds cccccccccccc, not the gated chat@7 " \
                                                  "(bbbbbbbbbbbb)"


def test_a_newline_in_a_reason_never_makes_a_second_reason():
    """A rejection note with \\n or \\r (or a Unicode line separator) was split into two lines of
    `reasons`: a note could forge a condition line."""
    gate = {**GATE, "reasons": ["approval: rejected by bob: bad\nfingerprints: ok", "x: a\rb\u2028c\x0bd"]}
    outputs = gate_outputs(gate)
    assert outputs["reasons"].split("\n") == ["approval: rejected by bob: bad fingerprints: ok", "x: a b c d"]
    assert parse_github_output(github_output(outputs))["reasons"].splitlines() == outputs["reasons"].split("\n")
    env = parse_dotenv(dotenv(gate_outputs({**gate, "pair": "chat\nSPECREG_VERDICT=pass"})))
    assert env["SPECREG_VERDICT"] == "refused" and env["SPECREG_PAIR"] == "chat SPECREG_VERDICT=pass"


def test_a_pair_input_with_a_newline_cannot_forge_a_summary_heading(tmp_path):
    from clirun import run_specreg

    forged = "chat@1\n## specreg gate chat@1 → production: PASS"
    report = tmp_path / "gate.md"
    result = run_specreg(["gate", forged, "--env", "production", "--markdown", report, "--db",
                          f"sqlite:///{tmp_path / 'r.db'}"])
    assert result.returncode == 2, result.stderr
    text = report.read_text()
    assert [line for line in text.splitlines() if line.startswith("#")] == [
        "## specreg gate `chat@1 ## specreg gate chat@1 → production: PASS`: ERROR"], text


@pytest.mark.parametrize("content", ["[" * 200_000, "{\"pair\": " * 100_000])
def test_a_deeply_nested_lock_or_gate_json_is_one_line(tmp_path, content):
    """Was: RecursionError traceback (`ci-outputs --lock`, a lock nested 200,000 deep)."""
    from clirun import one_line, run_specreg

    gate, lock = tmp_path / "gate.json", tmp_path / "lock.json"
    gate.write_text(json.dumps(GATE))
    lock.write_text(content)
    one_line(run_specreg(["ci-outputs", gate, "--style", "github", "--lock", lock]), 100,
             f"pair lock {lock}: not a readable specreg.lock.json (nested too deeply)")
    one_line(run_specreg(["ci-outputs", lock, "--style", "github"]), 2,
             f"gate JSON {lock}: not readable JSON (nested deeper than 32 levels)")


# --- the verify image's inputs: a pinned base, no secrets in its layers --------------------------

def dockerignored(relative: str, patterns: list[str]) -> bool:
    """Whether docker/podman leave ``relative`` (a path under the build context) out of the
    context, by .dockerignore's rules: Go's filepath.Match per segment ('*' never crosses '/'),
    '**' any number of segments, a pattern naming a folder leaves out all beneath it, a
    leading '!' takes a path back in (the last pattern that matches decides)."""
    def regex(pattern: str) -> re.Pattern:
        parts = []
        for segment in pattern.strip("/").split("/"):
            parts.append("(?:.*/)?" if segment == "**" else
                         re.escape(segment).replace(r"\*", "[^/]*").replace(r"\?", "[^/]") + "/")
        return re.compile("".join(parts).removesuffix("/") + "(?:/.*)?")
    excluded = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        if regex(pattern.removeprefix("!")).fullmatch(relative):
            excluded = not negated
    return excluded


def test_the_verify_image_copies_no_key_database_or_env_file():
    """Was: keys/specreg-signing.key (where the quickstart writes it), registry.db and .env went
    into the `COPY . /src` layer, which keeps them though a later step deletes /src."""
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    for secret in ("keys/specreg-signing.key", "keys/specreg-signing.pub", "registry.db", ".env", ".env.local",
                   "deploy/keyring.json", "sub/dir/bob.key", "sub/ca.pem", "sub/.env", "registry.db-wal"):
        assert dockerignored(secret, patterns), secret
    for needed in ("pyproject.toml", "specreg/cli/root.py", "registry/deploy/verify.py", "templates/engines",
                   "README.md"):
        assert not dockerignored(needed, patterns), needed


def test_the_verify_image_and_the_gitlab_template_pin_their_base_by_digest():
    """Was `python:3.11-slim`: a tag that moves with every rebuild upstream."""
    digest = re.compile(r"python:3\.11-slim@sha256:[0-9a-f]{64}")
    (base,) = [argument for kind, argument in containerfile_instructions() if kind == "FROM"]
    assert digest.fullmatch(base), base
    assert GITLAB["image"] == base  # one base for the image and the pipeline's gate


@pytest.mark.parametrize("committed", ["gate.md", "gate.xml", "gate.env", "gate.json"])
@pytest.mark.parametrize("kind", ["symlink", "dangling", "file"])
def test_the_gitlab_template_refuses_reports_a_checkout_commits(tmp_path, committed, kind):
    """Was: a merge request committing gate.md/gate.xml/gate.env as symlinks had the job write
    (and append SPECREG_*= lines) where they pointed, e.g. a stand-in .bashrc. The script's
    first line refuses them before the gate runs."""
    project, victim = tmp_path / "project", tmp_path / "bashrc"
    project.mkdir()
    if kind == "symlink":
        victim.write_text("alias ls=ls\n")
    if kind == "file":
        (project / committed).write_text("SPECREG_VERDICT=pass\n")
    else:
        os.symlink(victim, project / committed)
    script = "\n".join(["set -eo pipefail", *GITLAB["script"]])
    fake_bin = tmp_path / "bin"  # a `specreg` that records being run: the check comes first
    fake_bin.mkdir()
    (fake_bin / "specreg").write_text("#!/bin/sh\ntouch \"$0.ran\"\n")
    (fake_bin / "specreg").chmod(0o755)
    result = subprocess.run(["bash", "-c", script], cwd=project, capture_output=True, text=True, timeout=60,
                            env={**clean_env(), "PATH": f"{fake_bin}:{os.environ['PATH']}"})
    assert result.returncode == 1 and f"specreg: {committed} is already in the checkout" in result.stderr
    assert not (fake_bin / "specreg.ran").exists()
    assert victim.read_text() == "alias ls=ls\n" if kind == "symlink" else not victim.exists()


# --- the GitLab template as GitLab runs it: gitlab-ci-local, the docs' pipeline, its default install --

GITLAB_CI_LOCAL = "4.65.1"  # runs on Node 20 with --force-shell-executor (4.75.1 crashes there)


@pytest.fixture(scope="session")
def gitlab_ci_local() -> Path:
    """gitlab-ci-local, installed once by npm into the engine cache (outside the repository).
    Skipped where npm cannot install it (offline, no Node), a failure with CI=true."""
    from helpers import in_ci

    from specreg.core.packages import cache_root

    prefix = cache_root() / f"gitlab-ci-local-{GITLAB_CI_LOCAL}"
    binary = prefix / "node_modules" / ".bin" / "gitlab-ci-local"
    if not binary.exists():
        problem = "npm is not installed" if shutil.which("npm") is None else None
        if problem is None:
            installed = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--prefix", str(prefix),
                                        f"gitlab-ci-local@{GITLAB_CI_LOCAL}"], capture_output=True, text=True,
                                       timeout=600)
            problem = None if installed.returncode == 0 and binary.exists() else installed.stderr[-500:]
        if problem is not None:
            (pytest.fail if in_ci() else pytest.skip)(f"gitlab-ci-local {GITLAB_CI_LOCAL} not installed: {problem}")
    return binary


def archive_server(source_tree: Path, root: Path, project: str, ref: str):
    """A local web server with what GitLab serves at /PROJECT/-/archive/REF/NAME-REF.tar.gz: the
    source tree under one top folder. Returns (its URL, the server to shut down)."""
    import functools
    import http.server
    import tarfile
    import threading

    archive = root / project / "-" / "archive" / ref / f"specreg-{ref}.tar.gz"
    archive.parent.mkdir(parents=True)
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(source_tree, arcname=f"specreg-{ref}")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}", server


@pytest.mark.slow
def test_the_docs_gitlab_pipeline_installs_the_default_requirement_and_gates(gitlab_ci_local, source_tree,
                                                                            deployed, tmp_path):
    """Was: the template's default SPECREG_REQUIREMENT "specreg[gate]==0.1.0" cannot install
    (specreg is not on the package index) and the docs' include did not override it. The docs'
    own pipeline (its include made local) runs under gitlab-ci-local; the default requirement
    downloads the include's project archive from CI_SERVER_URL, here a local server."""
    import yaml

    pipeline = yaml.safe_load(re.findall(r"```yaml\n(.*?)```", (ROOT / "docs" / "ci.md").read_text(), re.S)[1])
    variables = pipeline["variables"]
    assert {"SPECREG_PROJECT", "SPECREG_REF"} <= set(variables)  # the docs set what the default installs
    assert pipeline["include"][0]["file"] == "ci/specreg-gate.gitlab-ci.yml"
    pipeline["include"] = [{"local": "ci/specreg-gate.gitlab-ci.yml"}]
    project = tmp_path / "project"
    (project / "ci").mkdir(parents=True)
    (project / "deploy").mkdir()
    shutil.copy(ROOT / "ci" / "specreg-gate.gitlab-ci.yml", project / "ci")
    shutil.copy(deployed["lock"], project / "deploy" / "specreg.lock.json")
    (project / ".gitlab-ci.yml").write_text(yaml.safe_dump(pipeline))
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.org"]
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "pipeline"]):
        subprocess.run([*git, *command], cwd=project, check=True, capture_output=True)
    url, server = archive_server(source_tree, tmp_path / "gitlab", variables["SPECREG_PROJECT"], variables["SPECREG_REF"])
    try:
        result = subprocess.run(
            [str(gitlab_ci_local), "--force-shell-executor", "--ignore-predefined-vars", "CI_SERVER_URL",
             "--variable", f"CI_SERVER_URL={url}", "--variable", "PAIR=lock@1", "--variable", "TARGET_ENV=staging",
             "--variable", f"SPECREG_DB={deployed['db']}", "specreg-gate"],
            cwd=project, env=clean_env(), capture_output=True, text=True, timeout=900)
    finally:
        server.shutdown()
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "PASS" in result.stdout
    (report,) = (project / ".gitlab-ci-local").rglob("gate.env")
    env = parse_dotenv(report.read_text())
    assert env["SPECREG_VERDICT"] == "pass" and env["SPECREG_VERSION"] == "1"
    assert env["SPECREG_LOCK_DIGEST"] == hashlib.sha256(deployed["lock"].read_bytes()).hexdigest()

"""`validate` mirrors to MLflow through a helper process that imports MLflow and opens its store
while the checks run (usecases/mirror.MirrorHelper, specreg/cli/mirror_helper.py): what MLflow
holds afterwards is what the in-process mirror writes; a helper that fails leaves the mirror to
the command itself; MLflow unreachable is the same warning; a cancelled helper writes nothing.
Real registry databases, real MLflow stores (the embedded one, read back with MlflowClient)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from specreg.api import Registry
from specreg.usecases.mirror import MirrorHelper, mirror

from clirun import SPECREG  # tests/ is on sys.path (tests/conftest.py)

sys.path.insert(0, str(Path(__file__).parent.parent / "governance"))
from govstate import record_validation  # noqa: E402

HELPER = [sys.executable, "-m", "specreg.cli.mirror_helper"]


def mlflow_runs(uri: str, pair: str) -> list:
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(f"specreg/{pair}")
    return client.search_runs([experiment.experiment_id]) if experiment else []


def registered(db_url: str, tiny_models, uri: str | None = None) -> Registry:
    registry = Registry(db_url, user="tester", mlflow_uri=uri)
    registry.register("hp", target=str(tiny_models["target"]), draft=str(tiny_models["draft"]),
                      num_speculative_tokens=3)
    return registry


@pytest.mark.slow
def test_validate_mirrors_through_its_helper_without_importing_mlflow(tmp_path, tiny_models, monkeypatch):
    """The CLI's own process never imports MLflow (its -X importtime lines name no mlflow
    module), and MLflow holds the run, marked complete, with its id recorded in the registry."""
    golden = tmp_path / "one.yaml"
    golden.write_text(textwrap.dedent("""\
        name: one
        version: 1
        records:
          - {id: raw-1, category: code, prompt: "def add(a, b):", max_new_tokens: 6}
        """))
    monkeypatch.setenv("SPECREG_MLFLOW", "on")
    env = dict(os.environ)
    subprocess.run([*SPECREG, "register", "hp", "--target", str(tiny_models["target"]), "--draft",
                    str(tiny_models["draft"]), "--num-speculative-tokens", "3"], env=env, check=True,
                   capture_output=True)
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "specreg.cli", "validate", "hp@1", "--golden",
                           str(golden), "--device", "cpu", "--checks", "integrity,equivalence", "--json"],
                          env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    imported = [line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")]
    assert "sqlalchemy" in imported and not [name for name in imported if name.split(".")[0] == "mlflow"]
    registry = Registry(user="tester")
    [run] = registry.validation_runs("hp@1")
    [mirrored] = mlflow_runs(registry.review.tracking_uri, "hp")
    tags = mirrored.data.tags
    assert tags["specreg.validation_id"] == f"hp@1/validation-{run.id}" and tags["specreg.synced"] == "true"
    assert run.mlflow_run_id == mirrored.info.run_id
    assert json.loads(done.stdout)["state"] == "validated"


def test_a_failing_helper_leaves_the_mirror_to_the_command(db_url, tiny_models, monkeypatch):
    monkeypatch.setenv("SPECREG_MLFLOW", "on")
    registry = registered(db_url, tiny_models)
    run_id = record_validation(registry, "hp@1")
    helper = MirrorHelper([sys.executable, "-c", "import sys; sys.stdin.read(); sys.exit(3)"])
    mirror(registry, "hp@1", helper)
    assert helper.process.returncode == 3
    [mirrored] = mlflow_runs(registry.review.tracking_uri, "hp")
    assert mirrored.data.tags["specreg.validation_id"] == f"hp@1/validation-{run_id}" and registry.warnings == []


def test_the_helper_mirrors_and_passes_back_mlflow_being_behind(db_url, tiny_models, monkeypatch):
    monkeypatch.setenv("SPECREG_MLFLOW", "on")
    registry = registered(db_url, tiny_models)
    run_id = record_validation(registry, "hp@1")
    helper = MirrorHelper([*HELPER, ""])
    mirror(registry, "hp@1", helper)
    assert helper.process.returncode == 0 and registry.warnings == [] and registry._review is None
    [mirrored] = mlflow_runs(registry.review.tracking_uri, "hp")
    assert mirrored.data.tags["specreg.validation_id"] == f"hp@1/validation-{run_id}"
    assert registry.validation_runs("hp@1")[-1].mlflow_run_id == mirrored.info.run_id

    down = "http://127.0.0.1:9"  # nothing listens on the discard port
    unreachable = Registry(db_url, user="tester", mlflow_uri=down)
    helper = MirrorHelper([*HELPER, down])
    mirror(unreachable, "hp@1", helper)
    assert helper.process.returncode == 0
    [warning] = unreachable.warnings
    assert warning.startswith(f"MLflow ({down}) is behind:") and "run `specreg sync`" in warning


def test_a_cancelled_helper_opens_the_store_and_mirrors_nothing(tmp_path, tiny_models, monkeypatch):
    monkeypatch.setenv("SPECREG_MLFLOW", "on")
    registry = registered(f"sqlite:///{tmp_path / 'registry.db'}", tiny_models)
    record_validation(registry, "hp@1")
    helper = MirrorHelper([*HELPER, ""])
    helper.cancel()
    assert helper.process.returncode == 0
    assert (tmp_path / "specreg-home" / "mlflow" / "mlflow.db").is_file()
    assert mlflow_runs(registry.review.tracking_uri, "hp") == []


def test_a_helper_ended_without_the_interpreters_teardown_keeps_its_exit_status(tmp_path):
    """The helper ends without the interpreter's teardown of MLflow's modules (the command waits
    for its exit), but keeps its exit status: 1 for a request it cannot read, 0 for an empty one."""
    env = {**os.environ, "SPECREG_HOME": str(tmp_path), "SPECREG_MLFLOW": "on"}
    ours = own_autogroup()
    failed = subprocess.run([*HELPER, ""], input="not json\n", capture_output=True, text=True, env=env)
    assert failed.returncode == 1 and "JSONDecodeError" in failed.stderr and failed.stdout == ""
    ended = subprocess.run([*HELPER, ""], input="", capture_output=True, text=True, env=env)
    assert ended.returncode == 0 and ended.stdout == ""
    # run in this process's session, the helper lowers itself, never the autogroup it shares with us
    assert own_autogroup() == ours


def own_autogroup() -> str | None:
    """This process's /proc/self/autogroup ("/autogroup-N nice V"), None where there is none."""
    path = Path("/proc/self/autogroup")
    return path.read_text() if path.is_file() else None


def autogroup_nice(pid: int | str) -> int:
    """The nice value of the scheduling autogroup of a process (/proc/PID/autogroup: "/autogroup-N nice V")."""
    return int(Path(f"/proc/{pid}/autogroup").read_text().split()[-1])


def scheduled_in_autogroups() -> bool:
    """Whether this process is scheduled by an autogroup: the kernel has them turned on, and the
    process sits in the root CPU cgroup (in a container's cgroup, as CI runs, the cgroup schedules
    it, and /proc/self/autogroup reads empty)."""
    enabled = Path("/proc/sys/kernel/sched_autogroup_enabled")
    return (enabled.is_file() and enabled.read_text().strip() == "1"
            and bool((own_autogroup() or "").strip()))


@pytest.mark.skipif(not scheduled_in_autogroups(), reason="no scheduling autogroup applies to this process")
def test_the_helper_yields_to_the_command_in_its_own_autogroup(tmp_path, monkeypatch):
    """The helper runs in a session of its own, which Linux makes an autogroup of its own, and a
    process's nice counts only inside its autogroup: the helper lowers its group, and the
    command's own group keeps its nice."""
    import time

    monkeypatch.setenv("SPECREG_HOME", str(tmp_path))
    ours = autogroup_nice("self")
    helper = MirrorHelper([*HELPER, ""])
    try:
        deadline = time.monotonic() + 60
        while autogroup_nice(helper.process.pid) != 10 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert autogroup_nice(helper.process.pid) == 10
        nice = int(Path(f"/proc/{helper.process.pid}/stat").read_text().rsplit(")", 1)[1].split()[16])
        assert nice == min(19, os.nice(0) + 10)  # 10 below what it inherited (tests may run under nice)
        assert autogroup_nice("self") == ours
    finally:
        helper.cancel()
    assert helper.process.returncode == 0


def test_without_autogroups_the_helper_lowers_its_own_priority(tmp_path):
    code = ("import os; from specreg.cli.mirror_helper import lower_priority\n"
            f"lower_priority({str(tmp_path / 'no' / 'autogroup')!r}); print(os.nice(0))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                          start_new_session=True)  # a session of its own, as MirrorHelper starts it
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(min(19, os.nice(0) + 10))]

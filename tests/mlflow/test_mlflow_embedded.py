"""The embedded store (no server): sqlite + artifacts under $SPECREG_HOME/mlflow, and the
`specreg ui` command line serving it."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from mlflow_server import MlflowServer, free_port
from specreg.errors import UsageError
from specreg.registry.review.mlflow_ui import local_artifact_root, ui_command
from specreg.registry.review.mlflow_sync import MlflowSync
from specreg.settings import specreg_home


@pytest.mark.slow
def test_embedded_store_keeps_artifacts_in_specreg_home_and_ui_serves_it(
    tmp_path, monkeypatch, pair_name, make_pair_version, make_validation
):
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    monkeypatch.chdir(workdir)  # MLflow's default would put artifacts in ./mlruns here
    sync = MlflowSync()
    home = specreg_home()
    assert sync.tracking_uri == f"sqlite:///{home / 'mlflow' / 'mlflow.db'}"
    assert sync.artifact_root == (home / "mlflow" / "artifacts").resolve()

    pair_version = make_pair_version(pair_name)
    run_id = sync.log_validation(pair_version, make_validation(), {"summary.md": "# gate"})
    number = sync.ensure_model_version(pair_version, run_id, "# gate", {})
    sync.set_alias(pair_name, "staging", pair_version)

    manifests = list(sync.artifact_root.rglob(f"{run_id}/artifacts/pair/pair.yaml"))
    assert len(manifests) == 1, list(sync.artifact_root.rglob("*"))
    assert not (workdir / "mlruns").exists()
    assert os.listdir(workdir) == []

    # `specreg ui`: the argv it runs serves this very store; the real command runs it.
    port = free_port()
    argv = ui_command(sync.tracking_uri, "127.0.0.1", port)
    assert argv[1:4] == ["-m", "mlflow", "server"]
    assert argv[argv.index("--backend-store-uri") + 1] == sync.tracking_uri
    assert argv[argv.index("--default-artifact-root") + 1] == str(sync.artifact_root)
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    cli = [sys.executable, "-m", "specreg.cli", "ui", pair_name, "--port", str(port)]
    server = MlflowServer(tmp_path / "ui", port=port, argv=cli).start()
    try:
        # `specreg ui` prints the URL once the server answers and its own process holds the port,
        # which it checks a moment after the server turns healthy
        url_line = f"MLflow UI: http://127.0.0.1:{port}/#/models/specreg.{pair_name}"
        deadline = time.monotonic() + 30
        while url_line not in server.log_tail() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert url_line in server.log_tail()
        name = sync.registered_model_name(pair_name)
        model_version = server.get("model-versions/get", name=name, version=number)["model_version"]
        assert model_version["source"] == f"runs:/{run_id}/pair"
        assert "staging" in model_version["aliases"]
        listing = server.get("artifacts/list", run_id=run_id, path="pair")
        assert {entry["path"] for entry in listing["files"]} == {
            "pair/pair.yaml", "pair/summary.md", "pair/validation.json"}
    finally:
        server.stop()


def test_local_artifact_root_and_remote_ui():
    assert local_artifact_root("sqlite:////data/ml/mlflow.db") == Path("/data/ml/artifacts")
    assert local_artifact_root("http://mlflow.internal:5000") is None
    with pytest.raises(UsageError, match="mlflow.internal"):
        ui_command("http://mlflow.internal:5000", "127.0.0.1", 5000)


def test_a_validation_run_is_named_by_its_whole_run_number(tmp_path, monkeypatch, pair_name, make_pair_version,
                                                           make_validation):
    """Was `chat@1 warn chat@1/valid`: the validation key (label/validation-N) cut to 12 characters."""
    monkeypatch.chdir(tmp_path)
    sync = MlflowSync()
    pair_version = make_pair_version(pair_name)
    validation = {**make_validation("warn"), "id": f"{pair_version.label}/validation-12345"}
    run_id = sync.log_validation(pair_version, validation, {"summary.md": "# gate"})
    assert sync.client.get_run(run_id).info.run_name == f"{pair_version.label} warn validation-12345"

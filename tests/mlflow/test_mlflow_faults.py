"""MLflow going away: fail fast with MlflowUnavailable, then catch up after a restart."""

from __future__ import annotations

import time

import pytest

from mlflow_server import MlflowServer
from specreg.errors import MlflowUnavailable, SpecregError
from specreg.registry.review.mlflow_sync import MlflowSync


def _count_model_versions(server: MlflowServer, name: str) -> int:
    return len(server.get("model-versions/search", filter=f"name='{name}'").get("model_versions", []))


@pytest.mark.slow
def test_killed_server_fails_fast_and_resync_completes(
    mlflow_server, pair_name, make_pair_version, make_validation
):
    # The session server is killed and restarted on the same port and store (one server start
    # cheaper than a server of its own); `finally` leaves it running for the other tests.
    server = mlflow_server
    try:
        sync = MlflowSync(server.url)
        v1, v2 = make_pair_version(pair_name, 1), make_pair_version(pair_name, 2)
        validation1, validation2 = make_validation(), make_validation()
        run1 = sync.log_validation(v1, validation1)

        server.kill()  # mid-way: v1 has its run but no model version, v2 has nothing
        for step in (
            lambda: sync.ensure_model_version(v1, run1, "summary v1", {}),
            lambda: sync.log_validation(v2, validation2),
            lambda: sync.read_approval(v1),
        ):
            started = time.monotonic()
            with pytest.raises(MlflowUnavailable, match=server.url) as raised:
                step()
            assert time.monotonic() - started < 15, "an unreachable MLflow must fail in seconds"
            assert isinstance(raised.value, SpecregError)
            assert "\n" not in str(raised.value)  # one line for the CLI

        server.start()
        # `specreg sync` replays everything; twice, to show it creates nothing twice.
        for _ in range(2):
            fresh = MlflowSync(server.url)
            runs = [fresh.log_validation(v, val) for v, val in ((v1, validation1), (v2, validation2))]
            numbers = [fresh.ensure_model_version(v, run, f"summary v{v.version}", {})
                       for v, run in zip((v1, v2), runs)]
            fresh.set_alias(pair_name, "staging", v2)
        assert runs[0] == run1
        name = fresh.registered_model_name(pair_name)
        assert _count_model_versions(server, name) == 2
        for number, run_id in zip(numbers, runs):
            model_version = server.get("model-versions/get", name=name, version=number)["model_version"]
            assert model_version["source"] == f"runs:/{run_id}/pair"
        alias = server.get("registered-models/alias", name=name, alias="staging")
        assert alias["model_version"]["version"] == str(numbers[1])
        experiment = server.get("experiments/get-by-name", experiment_name=f"specreg/{pair_name}")
        found = server.post("runs/search", {"experiment_ids": [experiment["experiment"]["experiment_id"]]})
        assert len(found["runs"]) == 2
    finally:
        if not server.healthy():
            server.kill()
            server.start()


def test_nothing_listening_fails_fast(make_pair_version, pair_name):
    from mlflow_server import free_port

    sync = MlflowSync(f"http://127.0.0.1:{free_port()}")
    started = time.monotonic()
    with pytest.raises(MlflowUnavailable):
        sync.ping()
    with pytest.raises(MlflowUnavailable):
        sync.mirror_state(make_pair_version(pair_name))
    assert time.monotonic() - started < 20

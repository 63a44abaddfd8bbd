"""Validation runs in the store, on SQLite and PostgreSQL: start/record/finish, state moves with
an audit event naming the run, abort and error leave the state alone, dead runs are reaped,
baselines of the previous validated version."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from specreg.registry.store.entities import PairState
from specreg.core.types import CheckResult


@pytest.fixture
def store_registry(db_url, models):
    from specreg.api import Registry

    registry = Registry(db_url, user="tester")
    registry.register("p", target=str(models["target"]), draft=str(models["draft"]), num_speculative_tokens=3)
    registry.register("p", target=str(models["target"]), draft=str(models["self"]), num_speculative_tokens=3)
    return registry


def start(runs, version):
    return runs.start(version, golden_set="tiny", golden_sha256="a" * 64, environment={"device": "cpu"},
                      options={"checks": ["acceptance"]}, actor="tester")


def test_run_lifecycle_and_baselines(store_registry):
    from specreg.registry.store.validations import ValidationStore

    runs = ValidationStore(store_registry.store)
    v1, v2 = store_registry.get("p@1"), store_registry.get("p@2")
    run = start(runs, v1)
    assert run.status == "running" and run.pid is not None
    runs.record_check(run.id, CheckResult("acceptance", "pass", "ok", {"x": [1]}, {"acceptance_rate": 0.8}))
    baselines = {"tau_definition": "engines", "overall": {"acceptance_rate": 0.8, "mean_acceptance_length": 2.5},
                 "per_category": {}}
    finished, moved = runs.finish(run.id, v1, passed=True, summary={"verdict": "pass"}, baselines=baselines,
                                  actor="tester")
    assert finished.status == "passed" and finished.finished_at is not None
    assert finished.checks[0].figures == {"acceptance_rate": 0.8} and finished.checks[0].evidence == {"x": [1]}
    assert moved.state is PairState.VALIDATED
    assert store_registry.baselines("p@1") == baselines
    assert runs.previous_baselines("p", 2) == (1, baselines)
    assert runs.previous_baselines("p", 1) is None
    event = store_registry.history("p")[-1]
    assert event.details["validation_run_id"] == run.id and event.to_state == "validated"

    failing = start(runs, v2)
    runs.record_check(failing.id, CheckResult("acceptance", "fail", "dropped"))
    finished, moved = runs.finish(failing.id, v2, passed=False, summary={}, baselines=baselines, actor="tester")
    assert finished.status == "failed" and finished.baselines is None and moved.state is PairState.FAILED
    assert "acceptance" in store_registry.history("p")[-1].reason
    assert store_registry.verify_audit()[1] is None

    # statuses are enums in the code and the same plain words in the database
    from sqlalchemy import text

    from specreg.core.statuses import RunStatus

    assert finished.status is RunStatus.FAILED and finished.checks[0].status == "fail"
    with store_registry.store.engine.connect() as connection:
        rows = connection.execute(text("SELECT r.status, c.status FROM validation_runs r JOIN check_results c "
                                       "ON c.validation_run_id = r.id ORDER BY r.id")).all()
    assert [tuple(row) for row in rows] == [("passed", "pass"), ("failed", "fail")]
    assert all(type(value) is str for row in rows for value in row)


def test_baselines_recorded_before_engine_tau_are_read_under_their_own_names(store_registry):
    """A run stored before tau was counted as the engines count it (no tau_definition) is not
    rewritten; every reader gets its figures under their own names and no engine tau, so nothing
    compares an engine's tau with tokens per target forward."""
    from sqlalchemy import select

    from specreg.registry.store.orm import ValidationRunRow
    from specreg.registry.store.validations import ValidationStore

    runs = ValidationStore(store_registry.store)
    v1 = store_registry.get("p@1")
    run = start(runs, v1)
    old = {"k": 3, "overall": {"acceptance_rate": 0.8, "mean_acceptance_length": 1.45,
                               "per_position_acceptance": [0.8, 0.5]},
           "per_category": {"code": {"acceptance_rate": 0.9, "mean_acceptance_length": 1.6}}}
    runs.finish(run.id, v1, passed=True, summary={}, baselines=old, actor="tester")
    read = store_registry.baselines("p@1")
    assert read["tau_definition"] == "tokens_per_target_forward" and read["k"] == 3
    assert read["overall"] == {"acceptance_rate": 0.8, "mean_acceptance_length": None, "tokens_per_target_forward": 1.45,
                               "per_position_acceptance": None, "per_position_acceptance_conditional": [0.8, 0.5]}
    assert read["per_category"]["code"]["tokens_per_target_forward"] == 1.6
    assert read["per_category"]["code"]["mean_acceptance_length"] is None
    assert runs.previous_baselines("p", 2) == (1, read)
    with store_registry.store.session() as session:  # the stored row is as it was written
        assert session.scalars(select(ValidationRunRow.baselines)).one() == old


def test_abort_and_reap_leave_state_unchanged(store_registry):
    from specreg.registry.store.validations import ValidationStore

    runs = ValidationStore(store_registry.store)
    v1 = store_registry.get("p@1")
    aborted = start(runs, v1)
    runs.abort(aborted.id, "aborted", "interrupted by SIGTERM")
    assert runs.get(aborted.id).status == "aborted"
    # a run whose process is gone (a child that has exited and been reaped) is found and abandoned,
    # the process named
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    orphan = start(runs, v1)
    with store_registry.store.session(write=True) as session:
        from specreg.registry.store.orm import ValidationRunRow

        session.get(ValidationRunRow, orphan.id).pid = child.pid
    alive = start(runs, v1)  # this process: alive
    assert runs.reap_dead_runs() == 1
    assert runs.get(orphan.id).status == "abandoned"
    assert runs.get(orphan.id).error.startswith(f"its process (pid {child.pid} on {socket.gethostname()}, started ")
    assert runs.get(orphan.id).error.endswith(" UTC) is gone: killed before it could finish")
    assert runs.get(alive.id).status == "running"
    assert store_registry.get("p@1").state is PairState.REGISTERED
    assert [e.action for e in store_registry.history("p")] == ["register", "register"]


def test_a_run_of_another_host_is_left_running_and_shown_with_its_host_and_pid(store_registry):
    """On a shared database a run validating on another host cannot be judged from here: it stays
    running, and `show` says where it runs so that someone can look there."""
    from clirun import run as cli
    from specreg.registry.store.orm import ValidationRunRow
    from specreg.registry.store.validations import ValidationStore

    runs = ValidationStore(store_registry.store)
    elsewhere = start(runs, store_registry.get("p@1"))
    with store_registry.store.session(write=True) as session:
        row = session.get(ValidationRunRow, elsewhere.id)
        row.environment = {**row.environment, "hostname": "gpu-node-7"}
        row.pid = 999_999_999  # no such process here: only that host could tell
    assert runs.reap_dead_runs() == 0 and runs.get(elsewhere.id).status == "running"
    shown = cli("show", "p@1", "--db", store_registry.db_url).stdout
    line = next(line for line in shown.splitlines() if line.startswith(f"  run {elsewhere.id} "))
    assert " running " in line and line.endswith("(pid 999999999 on gpu-node-7)"), line


def test_validate_on_this_database(store_registry, golden_path):
    outcome = store_registry.validate("p@1", golden=str(golden_path), checks="integrity,tokenizer")
    assert outcome.passed and outcome.version.state is PairState.VALIDATED
    runs = store_registry.validation_runs("p@1")
    assert [run.status for run in runs] == ["passed"]
    assert [check.name for check in runs[0].checks] == ["integrity", "tokenizer"]

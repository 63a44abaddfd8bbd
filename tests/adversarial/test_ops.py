"""Operations: real processes on real SQLite files and PostgreSQL databases, a real
HTTP endpoint."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from specreg.api import Registry

sys.path.insert(0, str(Path(__file__).parent.parent / "governance"))
from govstate import POLICY_TOML, record_validation  # noqa: E402
from metrics_server import FakeVllm, MetricsServer  # noqa: E402
from pgroles import as_user
from policyrecord import record_policy
from specreg.registry.store.store import SCHEMA_HEAD

from clirun import run  # tests/ is on sys.path (tests/conftest.py)

# A real `specreg` process that waits for a shared start time, so that six of them reach the
# fresh database together (the CLI itself, its argv, nothing replaced).
AT_START = ("import sys, time; start = float(sys.argv[1]); time.sleep(max(0.0, start - time.time())); "
            "sys.argv = ['specreg'] + sys.argv[2:]; from specreg.cli import main; main()")


# --- item 12: parallel first commands on a fresh database ---------------------------------------

def test_six_parallel_registers_on_a_fresh_database(db_url, tiny_models):
    # import specreg and click in each process first, then start together
    start = time.time() + 6.0
    processes = [
        subprocess.Popen([sys.executable, "-c", AT_START, str(start), "register", "race",
                          "--target", str(tiny_models["target"]), "--draft", str(tiny_models["draft"]),
                          "-k", str(k), "--db", db_url, "--json"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for k in range(1, 7)]
    results = [(p.wait(timeout=180), p.stdout.read(), p.stderr.read()) for p in processes]
    for process in processes:
        process.stdout.close()
        process.stderr.close()
    failures = [(code, err) for code, _, err in results if code != 0]
    assert failures == [], failures
    registry = Registry(db_url)
    assert sorted(v.config.num_speculative_tokens for v in registry.list("race")) == [1, 2, 3, 4, 5, 6]
    assert sorted(v.version for v in registry.list("race")) == [1, 2, 3, 4, 5, 6]
    assert registry.store.current_revision() == SCHEMA_HEAD
    assert registry.verify_audit() == (6, None)


def test_migration_lock_serialises_and_times_out(db_url):
    from specreg.errors import StoreError
    from specreg.registry.store.migrate import migration_lock
    from specreg.registry.store.store import Store

    store = Store(db_url, check=False)
    other = Store(db_url, check=False)
    with migration_lock(store.engine):
        with pytest.raises(StoreError, match="migration lock"):
            with migration_lock(other.engine, timeout_s=0.3):
                pass
    with migration_lock(other.engine, timeout_s=0.3):  # released: the other process gets it
        pass


def test_a_process_reading_a_migration_in_progress_waits_for_it(db_url):
    """A fresh database shows the revisions between none and the head one by one while the first
    process migrates it; another process opening it then must wait for the migration lock and
    find the head, not refuse the database as out of date (seen once in the six-process race)."""
    import threading

    from specreg.registry.store.migrate import migration_lock
    from specreg.registry.store.store import Store

    migrating = Store(db_url, check=False)
    migrating.upgrade("0001")  # a migration part-way through, as another process sees it
    outcome = {}

    def open_store():
        try:
            outcome["revision"] = Store(db_url).current_revision()
        except Exception as exc:  # noqa: BLE001 - the test reports what happened
            outcome["error"] = str(exc)

    with migration_lock(migrating.engine):
        opener = threading.Thread(target=open_store)
        opener.start()
        opener.join(1.5)
        assert opener.is_alive(), outcome  # waiting on the lock, not refused at revision 0001
        migrating._upgrade("head")  # the migrating process finishes under its lock
    opener.join(30)
    assert outcome == {"revision": SCHEMA_HEAD}


# --- observe: interval and response size ---------------------------------------------------------

@pytest.fixture
def observed(db_url, tiny_models, tmp_path, monkeypatch):
    policy = tmp_path / "specreg.toml"
    policy.write_text(POLICY_TOML)
    record_policy(db_url, policy, tmp_path)
    alice = Registry(as_user(db_url, "alice"), user="alice")
    alice.register("watch", target=str(tiny_models["target"]), draft=str(tiny_models["draft"]), num_speculative_tokens=4)
    record_validation(alice, "watch@1")
    server = MetricsServer()
    engine = FakeVllm()
    engine.step("watch", 10, 4, [8, 6, 4, 2])
    server.body = engine.body
    yield db_url, server
    server.close()


@pytest.mark.parametrize("interval", ["nan", "inf", "1e300", "-1", "0"])
def test_observe_refuses_intervals_that_cannot_be_slept(observed, interval):
    db_url, server = observed
    result = run("observe", "watch@1", "--metrics-url", server.url, "--interval", interval, "--db", db_url)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stderr.count("\n") == 1 and "--interval" in result.stderr


def test_observe_reads_no_more_than_the_bound(observed):
    db_url, server = observed
    huge = b"# padding line of a hostile or wrong endpoint\n" * (17 * 2**20 // 46 + 1)  # > 16 MiB
    server.body = lambda: huge
    result = run("observe", "watch@1", "--metrics-url", server.url, "--interval", "0.1", "--db", db_url)
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert result.stderr.count("\n") == 1 and "more than 16777216 bytes" in result.stderr
    assert Registry(db_url).observations("watch@1") == []


# --- env history -------------------------------------------------------------

def test_env_history_names_who_held_production_when(db_url, tiny_models, tmp_path, monkeypatch, approval_key):
    policy = tmp_path / "specreg.toml"
    policy.write_text(POLICY_TOML)
    record_policy(db_url, policy, tmp_path)
    alice, bob = Registry(as_user(db_url, "alice"), user="alice"), Registry(as_user(db_url, "bob"), user="bob")
    labels = [alice.register("hist", target=str(tiny_models["target"]), draft=str(tiny_models["draft"]),
                             num_speculative_tokens=k).version.label for k in (4, 3, 2)]
    marks = {}
    for label in labels:
        record_validation(alice, label)
        bob.approve(label, key=approval_key(db_url, "bob"))
    alice.promote(labels[0], "production", reason="first")
    alice.promote(labels[0], "staging")  # another environment: not in production's history
    marks["v1"] = datetime.utcnow()
    alice.promote(labels[1], "production", reason="second")
    marks["v2"] = datetime.utcnow()
    alice.rollback("hist", "production", reason="v2 regressed")
    marks["back"] = datetime.utcnow()
    alice.promote(labels[2], "production")
    alice.retire(labels[2], reason="pulled", force=True)

    result = run("env", "history", "hist", "--env", "production", "--json", "--db", db_url)
    assert result.returncode == 0, result.stderr
    spans = json.loads(result.stdout)
    assert [(s["version"], s["action"], s["actor"], s["reason"]) for s in spans] == [
        (1, "promote", "alice", "first"), (2, "promote", "alice", "second"), (1, "rollback", "alice", "v2 regressed"),
        (3, "promote", "alice", None), (None, "retire", "alice", "pulled")]
    assert all(a["until"] == b["since"] for a, b in zip(spans, spans[1:])) and spans[-1]["until"] is None

    def held_at(moment: datetime) -> list:
        found = run("env", "history", "hist", "--env", "production", "--at", moment.isoformat() + "Z", "--json",
                    "--db", db_url)
        assert found.returncode == 0, found.stderr
        return [s["version"] for s in json.loads(found.stdout)]

    assert held_at(marks["v1"]) == [1]
    assert held_at(marks["v2"]) == [2]
    assert held_at(marks["back"]) == [1]
    assert held_at(marks["v1"] - timedelta(days=1)) == []  # before the first promotion
    assert held_at(datetime.utcnow() + timedelta(minutes=1)) == []  # retired with --force: empty

    text = run("env", "history", "hist", "--env", "production", "--at", marks["v2"].isoformat(), "--db", db_url)
    assert text.returncode == 0 and text.stdout.startswith("hist@2 held production at ")
    staging = json.loads(run("env", "history", "hist", "--env", "staging", "--json", "--db", db_url).stdout)
    assert [s["version"] for s in staging] == [1]


def test_env_history_user_mistakes(db_url, tiny_models):
    Registry(as_user(db_url, "alice"), user="alice").register("quiet", target=str(tiny_models["target"]),
                                            draft=str(tiny_models["draft"]), num_speculative_tokens=2)
    bad_time = run("env", "history", "quiet", "--env", "production", "--at", "yesterday", "--db", db_url)
    assert bad_time.returncode == 2 and bad_time.stderr.count("\n") == 1 and "yesterday" in bad_time.stderr
    unknown = run("env", "history", "nope", "--env", "production", "--db", db_url)
    assert unknown.returncode == 1 and "unknown pair nope" in unknown.stderr
    never = run("env", "history", "quiet", "--env", "production", "--db", db_url)
    assert never.returncode == 0 and "no version of quiet has held production" in never.stdout

"""Governance under attack: four-eyes by another
spelling of a name, identity claimed instead of authenticated, a malformed MLflow approval tag,
control characters forging output lines. Real databases (SQLite and PostgreSQL), real `specreg`
processes, exit codes and stderr as a user sees them."""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path

import pytest

from pgroles import as_user
from policyrecord import record_policy
from specreg.api import Registry
from specreg.errors import IdentityError
from specreg.registry.store.entities import PairState

sys.path.insert(0, str(Path(__file__).parent.parent / "governance"))
from govstate import POLICY_TOML, policy_file, record_validation, validated_pair  # noqa: E402,F401

from clirun import run  # tests/ is on sys.path (tests/conftest.py)
from helpers import in_ci


# --- item 2: one spelling per person ----------------------------------------------------------

@pytest.mark.parametrize("spelling", ["Alice", " alice", "alice ", "ALICE", "\uff41\uff4c\uff49\uff43\uff45"])
def test_registrant_cannot_approve_under_another_spelling(db_url, tiny_models, policy_file, spelling, approval_key):
    registry = validated_pair(db_url, tiny_models, "spell")
    result = run("approve", "spell@1", "--db", as_user(db_url, "alice"), "--user", spelling,
                 "--key", approval_key(db_url, "alice"))
    assert result.returncode == 100, result.stderr
    assert result.stderr == "specreg: error: four-eyes: alice registered spell@1 and cannot approve it\n"
    assert registry.get("spell@1").state is PairState.VALIDATED
    assert [e.action for e in registry.history("spell")] == ["register", "validate"]


@pytest.mark.parametrize("spelling, why", [
    ("\u0430lice", "mixes Cyrillic and Latin letters"),            # Cyrillic a + Latin lice
    ("\u0430\u0441\u0435", "every letter looks like a Latin one"),  # all-Cyrillic "ace"
    ("\u03bf\u03c1\u03b1", "every letter looks like a Latin one"),  # all-Greek "opa"
    ("ali\u200bce", "U+200B"),                                      # zero-width space
    ("bob\nmallory", "U+000A"),
    ("bob\x1b[2K", "U+001B"),
])
def test_confusable_and_control_names_are_refused(db_url, tiny_models, policy_file, spelling, why):
    registry = validated_pair(db_url, tiny_models, "conf")
    result = run("approve", "conf@1", "--db", as_user(db_url, "bob"), "--user", spelling)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and why in result.stderr, result.stderr
    assert registry.get("conf@1").state is PairState.VALIDATED
    with pytest.raises(IdentityError, match="confusable|not allowed"):
        Registry(db_url, user=spelling).user  # the Python API refuses the same names


def test_names_are_stored_in_their_one_spelling(db_url, tiny_models, policy_file, approval_key):
    registered = run("register", "norm", "--target", tiny_models["target"], "--draft", tiny_models["draft"], "-k", "2",
                     "--db", as_user(db_url, "carol"), "--user", "  Carol ", "--json")
    assert registered.returncode == 0, registered.stderr
    assert json.loads(registered.stdout)["registered_by"] == "carol"
    record_validation(Registry(db_url), "norm@1")
    approved = run("approve", "norm@1", "--db", as_user(db_url, "bob"), "--user", "BOB", "--json",
                   "--key", approval_key(db_url, "bob"))
    assert approved.returncode == 0, approved.stderr
    assert json.loads(approved.stdout)["actor"] == "bob"
    events = Registry(db_url).history("norm")
    assert [(e.action, e.actor) for e in events] == [("register", "carol"), ("validate", "validator"),
                                                     ("approve", "bob")]


def test_rows_written_before_normalisation_still_count_as_their_person(db_url, tiny_models, policy_file, monkeypatch,
                                                                       approval_key):
    # What an older specreg stored: the registrant exactly as typed, in the row and its event.
    import specreg.registry.store.store as store_module

    old = Registry(as_user(db_url, "alice"), user="alice")
    old._user = "Alice "
    with monkeypatch.context() as patch:
        patch.setattr(store_module, "normalize_user", lambda name, what="": name)
        old.register("legacy", target=str(tiny_models["target"]), draft=str(tiny_models["draft"]),
                     num_speculative_tokens=2)
    assert old.get("legacy@1").registered_by == "Alice "
    record_validation(old, "legacy@1")
    result = run("approve", "legacy@1", "--db", as_user(db_url, "alice"), "--user", "alice",
                 "--key", approval_key(db_url, "alice"))
    assert result.returncode == 100 and "four-eyes: alice registered legacy@1" in result.stderr
    assert run("approve", "legacy@1", "--db", as_user(db_url, "bob"), "--user", "bob",
               "--key", approval_key(db_url, "bob")).returncode == 0
    assert Registry(db_url).gate("legacy@1", "production").passed


# --- item 15: output cannot be forged ----------------------------------------------------------

FORGED = "ok\n2099-01-01T00:00:00  1        approve   validated  approved  mallory\x1b[2K\x1b]0;pwned\x07\u202e"


def test_control_characters_in_notes_and_reasons_cannot_forge_output_lines(db_url, tiny_models, policy_file,
                                                                           approval_key):
    validated_pair(db_url, tiny_models, "esc")
    alice = as_user(db_url, "alice")
    assert run("promote", "esc@1", "--to", "staging", "--reason", FORGED, "--db", alice, "--user", "alice").returncode == 0
    rejected = run("reject", "esc@1", "--note", FORGED, "--db", as_user(db_url, "bob"), "--user", "bob",
                   "--key", approval_key(db_url, "bob"))
    assert rejected.returncode == 0, rejected.stderr

    history = run("history", "esc", "--db", db_url)
    assert history.returncode == 0, history.stderr
    lines = history.stdout.splitlines()
    assert len(lines) == 2 + 4  # header, rule, register validate promote reject: one line each
    assert [line.split()[2] for line in lines[2:]] == ["register", "validate", "promote", "reject"]
    for text in (history.stdout, run("show", "esc@1", "--db", db_url).stdout):
        assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text
        assert "\\n2099-01-01T00:00:00" in text and "\\x1b[2K" in text and "\\u202e" in text
        assert not any(line.startswith("2099") or line.lstrip().startswith("2099") for line in text.splitlines())
    # the JSON keeps the exact text
    events = json.loads(run("history", "esc", "--db", db_url, "--json").stdout)
    assert events[2]["reason"] == FORGED

    # a gate's reason quotes the rejection note: escaped there too, and in the error line
    gate = run("gate", "esc@1", "--env", "production", "--db", db_url)
    assert gate.returncode == 100
    assert "\x1b" not in gate.stdout + gate.stderr
    (headline,) = gate.stderr.splitlines()  # the one reason and its fix on one line: no forged line
    assert headline.startswith("specreg: gate refused esc@1 for production under ")
    assert " under policy of record v1: approval: rejected by bob" in headline and "`specreg approve esc@1" in headline
    assert "rejected by bob: ok\\n2099" in headline and gate.stdout == ""


# --- item 3: identity from authentication --------------------------------------------------------

def test_on_postgres_the_actor_is_the_authenticated_role(postgres_url, tiny_models, policy_file, monkeypatch,
                                                         approval_key):
    alice, bob = as_user(postgres_url, "alice"), as_user(postgres_url, "bob")
    registered = run("register", "auth", "--target", tiny_models["target"], "--draft", tiny_models["draft"], "-k", "2",
                     "--db", alice, "--json", unset=("SPECREG_USER",))
    assert registered.returncode == 0, registered.stderr
    assert json.loads(registered.stdout)["registered_by"] == "alice"
    record_validation(Registry(postgres_url), "auth@1")

    own = run("approve", "auth@1", "--db", alice, "--key", approval_key(postgres_url, "alice"), unset=("SPECREG_USER",))
    assert own.returncode == 100 and "four-eyes: alice registered auth@1" in own.stderr
    claimed = run("approve", "auth@1", "--db", alice, "--user", "bob")
    assert claimed.returncode == 100 and claimed.stderr.count("\n") == 1
    assert "identity: connected to PostgreSQL as role alice, but --user/$SPECREG_USER says 'bob'" in claimed.stderr
    also_claimed = run("approve", "auth@1", "--db", alice, env={"SPECREG_USER": "bob"})
    assert also_claimed.returncode == 100 and "as role alice" in also_claimed.stderr
    assert Registry(postgres_url).get("auth@1").state is PairState.VALIDATED

    approved = run("approve", "auth@1", "--db", bob, "--json", "--key", approval_key(postgres_url, "bob"),
                   unset=("SPECREG_USER",))
    assert approved.returncode == 0, approved.stderr
    assert json.loads(approved.stdout)["actor"] == "bob"
    monkeypatch.delenv("SPECREG_USER")
    assert Registry(bob).user == "bob" and Registry(alice, user="Alice").user == "alice"
    with pytest.raises(Exception, match="as role alice"):
        Registry(alice, user="bob").user
    assert Registry(postgres_url).gate("auth@1", "production").passed


def test_a_claimed_user_allowed_by_the_policy_is_recorded_beside_the_role(postgres_url, tiny_models, tmp_path,
                                                                          approval_key):
    policy = tmp_path / "claimed.toml"
    policy.write_text(POLICY_TOML + "\n[identity]\nallow_claimed_user = true\n")
    record_policy(postgres_url, policy, tmp_path)
    validated_pair(postgres_url, tiny_models, "claim")
    approved = run("approve", "claim@1", "--db", as_user(postgres_url, "bob"), "--user", "carol",
                   "--key", approval_key(postgres_url, "carol"))
    assert approved.returncode == 0, approved.stderr
    [event] = [e for e in Registry(postgres_url).history("claim") if e.action == "approve"]
    assert event.actor == "carol"
    assert event.details["claimed_user"] == "carol" and event.details["authenticated_role"] == "bob"
    shown = run("policy", "show", "--policy", policy)
    assert "--user/$SPECREG_USER may name someone else (recorded as claimed beside the role)" in shown.stdout


def test_policy_show_says_identity_on_sqlite_is_advisory(tmp_path):
    shown = run("policy", "show")
    assert shown.returncode == 0
    assert "On SQLite identity is advisory" in shown.stdout
    assert "on PostgreSQL the actor is the authenticated database role (session_user)" in shown.stdout
    bad = tmp_path / "bad.toml"
    bad.write_text(POLICY_TOML + "\n[identity]\nallow_claimed_user = 'yes'\n")
    refused = run("policy", "show", "--policy", bad)
    assert refused.returncode == 2 and "identity.allow_claimed_user = 'yes' must be true or false" in refused.stderr


# --- approvals read from MLflow ------------------------------------

@pytest.fixture
def mirror_on(monkeypatch, policy_file):
    monkeypatch.setenv("SPECREG_MLFLOW", "on")


def set_tag(server, pair: str, value: str) -> None:
    server.post("model-versions/set-tag", {"name": f"specreg.{pair}", "version": "1",
                                           "key": "specreg.approval", "value": value})


def tags_of(server, pair: str) -> dict:
    version = server.get("model-versions/get", name=f"specreg.{pair}", version="1")["model_version"]
    return {t["key"]: t["value"] for t in version["tags"]}


def test_a_malformed_approval_tag_is_warned_about_and_ignored(db_url, tiny_models, mlflow_server, mirror_on,
                                                              approval_key):
    pair = f"lgtm-{uuid.uuid4().hex[:8]}"
    uri = ("--mlflow-uri", mlflow_server.url)
    registry = validated_pair(db_url, tiny_models, pair)
    assert run(*uri, "sync", pair, "--db", db_url).returncode == 0
    set_tag(mlflow_server, pair, "LGTM")
    bob_key = ("--key", approval_key(db_url, "bob"))

    rejected = run(*uri, "reject", f"{pair}@1", "--note", "not yet", "--db", as_user(db_url, "bob"), "--user", "bob",
                   *bob_key)
    assert rejected.returncode == 0, rejected.stderr
    assert "specreg: warning:" in rejected.stderr and "'LGTM' is not approved:<user> or rejected:<user>; ignored" in rejected.stderr
    assert tags_of(mlflow_server, pair)["specreg.approval"] == "rejected:bob"  # the registry's decision replaced it
    set_tag(mlflow_server, pair, "LGTM")
    approved = run(*uri, "approve", f"{pair}@1", "--db", as_user(db_url, "bob"), "--user", "bob", *bob_key)
    assert approved.returncode == 0, approved.stderr
    set_tag(mlflow_server, pair, "LGTM")
    promoted = run(*uri, "promote", f"{pair}@1", "--to", "production", "--db", as_user(db_url, "carol"), "--user", "carol")
    assert promoted.returncode == 0, promoted.stderr
    assert registry.get(f"{pair}@1").state is PairState.PROMOTED
    assert [e.action for e in registry.history(pair)] == ["register", "validate", "reject", "approve", "promote"]
    # the model version carries the registry's audit head (an anchor outside the database)
    assert tags_of(mlflow_server, pair)["specreg.audit_head"] == registry.store.audit_head()


def test_a_ui_tag_naming_another_user_is_a_request_until_they_sign(db_url, tiny_models, mlflow_server, mirror_on,
                                                                   approval_key):
    """On a shared MLflow server the registrant herself tags ``approved:bob``
    (MLflow records no author for a tag). Before: sync recorded it as bob's approval and the
    production gate passed. Now it is a request: nothing is recorded, the UI summary says
    "waiting for bob's signature", and only bob's own signed approval counts."""
    pair = f"ui-{uuid.uuid4().hex[:8]}"
    uri = ("--mlflow-uri", mlflow_server.url)
    registry = validated_pair(db_url, tiny_models, pair)
    assert run(*uri, "sync", pair, "--db", db_url).returncode == 0
    set_tag(mlflow_server, pair, "approved:Bob")
    synced = run(*uri, "sync", pair, "--db", as_user(db_url, "alice"), "--user", "alice")
    assert synced.returncode == 0, synced.stderr
    assert f"approval of {pair}@1 requested in MLflow for bob: waiting for bob's signature" in synced.stderr
    assert [e.action for e in registry.history(pair)] == ["register", "validate"]  # nothing recorded
    assert registry.get(f"{pair}@1").state is PairState.VALIDATED
    assert not registry.gate(f"{pair}@1", "production").passed
    version = mlflow_server.get("model-versions/get", name=f"specreg.{pair}", version="1")["model_version"]
    assert "waiting for bob's signature" in version["description"]
    assert tags_of(mlflow_server, pair)["specreg.approval"] == "approved:Bob"  # the request stays as the reviewer set it

    approved = run(*uri, "approve", f"{pair}@1", "--db", as_user(db_url, "bob"), "--user", "bob",
                   "--key", approval_key(db_url, "bob"))
    assert approved.returncode == 0, approved.stderr
    assert registry.gate(f"{pair}@1", "production").passed
    assert tags_of(mlflow_server, pair)["specreg.approval"] == "approved:bob"
    version = mlflow_server.get("model-versions/get", name=f"specreg.{pair}", version="1")["model_version"]
    assert "waiting for" not in version["description"]
    assert run(*uri, "sync", pair, "--db", db_url).returncode == 0  # nothing recorded twice
    assert len([e for e in registry.history(pair) if e.action == "approve"]) == 1


@pytest.mark.slow
def test_a_ui_tag_is_a_request_even_where_the_auth_app_lets_that_user_edit(tmp_path, tiny_models, policy_file,
                                                                          monkeypatch):
    """A real `mlflow server --app-name basic-auth` where carol holds EDIT on the model: a tag
    ``approved:carol`` is still only a request; the auth app is not asked."""
    import base64
    import urllib.request

    from mlflow_server import MlflowServer, free_port, mlflow_executable

    if not in_ci():
        pytest.importorskip("flask_wtf", reason="the MLflow basic-auth app needs Flask-WTF (pip install 'specreg[dev]')")

    root, port, password = tmp_path / "auth-mlflow", free_port(), "admin-pass-1234"
    root.mkdir()
    config = root / "basic_auth.ini"
    config.write_text(f"[mlflow]\ndefault_permission = READ\ndatabase_uri = sqlite:///{root / 'auth.db'}\n"
                      f"admin_username = admin\nadmin_password = {password}\n"
                      "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
                      "grant_default_workspace_access = false\n"
                      # without the cache every request re-runs PBKDF2: seconds each on a loaded machine
                      "auth_cache_ttl_seconds = 600\n")
    monkeypatch.setenv("MLFLOW_AUTH_CONFIG_PATH", str(config))
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "admin")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", password)
    monkeypatch.setenv("MLFLOW_FLASK_SERVER_SECRET_KEY", "specreg-test-secret")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "120")  # the user's setting wins over specreg's 5 s
    server = MlflowServer(root, port=port, argv=[
        *mlflow_executable(), "server", "--app-name", "basic-auth",
        "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}", "--serve-artifacts",
        "--artifacts-destination", str(root / "artifacts"), "--host", "127.0.0.1", "--port", str(port),
        "--workers", "1"]).start(timeout_s=180)

    def call(path: str, body: dict) -> dict:
        request = urllib.request.Request(
            f"{server.url}{path}", data=json.dumps(body).encode(), method="POST",
            headers={"Content-Type": "application/json",
                     "Authorization": "Basic " + base64.b64encode(f"admin:{password}".encode()).decode()})
        with urllib.request.urlopen(request, timeout=20) as response:
            return json.loads(response.read() or b"{}")

    try:
        pair = f"auth-{uuid.uuid4().hex[:8]}"
        db_url = f"sqlite:///{tmp_path / 'registry.db'}"
        registry = validated_pair(db_url, tiny_models, pair)
        uri = ("--mlflow-uri", server.url)
        monkeypatch.setenv("SPECREG_MLFLOW", "on")
        synced = run(*uri, "sync", pair, "--db", db_url)
        assert synced.returncode == 0, synced.stderr
        for user in ("carol", "dave"):
            call("/api/2.0/mlflow/users/create", {"username": user, "password": f"{user}-pass-1234"})
        call("/api/3.0/mlflow/users/permissions/grant", {"username": "carol", "resource_type": "registered_model",
                                                         "resource_id": f"specreg.{pair}", "permission": "EDIT"})

        def tag(value: str) -> None:
            call("/api/2.0/mlflow/model-versions/set-tag", {"name": f"specreg.{pair}", "version": "1",
                                                            "key": "specreg.approval", "value": value})

        tag("approved:carol")
        carol = run(*uri, "sync", pair, "--db", db_url, "--user", "alice")
        assert carol.returncode == 0, carol.stderr
        # before, the auth app's EDIT for carol made the tag carol's approval,
        # though anyone with EDIT (here the registrant's sync) could have written her name
        assert f"approval of {pair}@1 requested in MLflow for carol: waiting for carol's signature" in carol.stderr
        assert registry.get(f"{pair}@1").state is PairState.VALIDATED
        assert not registry.gate(f"{pair}@1", "production").passed
        assert [e.action for e in registry.history(pair)] == ["register", "validate"]
    finally:
        server.stop()

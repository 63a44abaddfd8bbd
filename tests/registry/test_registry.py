"""Registration, immutability, lifecycle and the audit chain, on SQLite and PostgreSQL."""

from __future__ import annotations

import dataclasses
import shutil

import pytest
from sqlalchemy import create_engine, select, text
from sqlalchemy.orm import Session

from pgroles import as_user
from specreg.api import Registry
from specreg.usecases.inputs import parse_ref
from specreg.errors import (IllegalTransitionError, ImmutableError, ModelReferenceError, NotFoundError,
                            UsageError)
from specreg.registry.store.entities import PairState
from specreg.registry.store.orm import AuditEventRow, PairRow, PairVersionRow


def count_rows(url: str) -> dict[str, int]:
    engine = create_engine(url.replace("postgresql+psycopg", "postgresql+psycopg"))
    with engine.connect() as connection:
        counts = {table: connection.execute(text(f"SELECT COUNT(*) FROM {table}")).scalar()
                  for table in ("pairs", "pair_versions", "audit_events")}
    engine.dispose()
    return counts


def test_register_records_both_fingerprints_and_config(db_url, tiny_models):
    registry = Registry(as_user(db_url, "alice"), user="alice")
    result = registry.register("chat-pair", target=str(tiny_models["target"]), draft=str(tiny_models["draft"]),
                               num_speculative_tokens=4, max_batch_size_for_speculation=16, notes="first")
    assert result.created
    version = result.version
    assert (version.name, version.version, version.state) == ("chat-pair", 1, PairState.REGISTERED)
    assert version.registered_by == "alice"
    assert version.config.num_speculative_tokens == 4 and version.config.max_batch_size_for_speculation == 16
    assert version.target.fingerprint.architecture == "LlamaForCausalLM"
    assert version.target.fingerprint.tokenizer_sha256 == version.draft.fingerprint.tokenizer_sha256
    assert version.target.fingerprint.weights_sha256 != version.draft.fingerprint.weights_sha256
    assert version.target.fingerprint.parameter_count > version.draft.fingerprint.parameter_count

    stored = Registry(db_url).get("chat-pair@1", with_events=True)
    assert stored.to_dict(with_events=False) == version.to_dict(with_events=False)
    assert [(e.action, e.from_state, e.to_state, e.actor, e.reason) for e in stored.events] == [
        ("register", None, "registered", "alice", "first")]
    assert count_rows(db_url) == {"pairs": 1, "pair_versions": 1, "audit_events": 1}


def test_same_binding_returns_existing_version_and_new_config_is_new_version(db_url, tiny_models):
    registry = Registry(db_url)
    args = dict(target=str(tiny_models["target"]), draft=str(tiny_models["draft"]))
    first = registry.register("p", num_speculative_tokens=4, **args)
    again = registry.register("p", num_speculative_tokens=4, **args)
    assert not again.created and again.version.version == 1
    other_k = registry.register("p", num_speculative_tokens=5, **args)
    other_draft = registry.register("p", target=str(tiny_models["target"]), draft=str(tiny_models["draft2"]),
                                    num_speculative_tokens=4)
    assert (other_k.version.version, other_draft.version.version) == (2, 3)
    assert first.version.binding_sha256 not in (other_k.version.binding_sha256, other_draft.version.binding_sha256)
    assert [v.version for v in registry.list("p")] == [1, 2, 3]
    assert count_rows(db_url)["audit_events"] == 3


def test_ngram_pair_has_no_draft(db_url, tiny_models):
    registry = Registry(db_url)
    version = registry.register("lookup", target=str(tiny_models["target"]), method="ngram",
                                num_speculative_tokens=3, prompt_lookup_max=5).version
    assert version.draft is None
    assert (version.config.prompt_lookup_min, version.config.prompt_lookup_max) == (1, 5)
    with pytest.raises(UsageError, match="ngram"):
        registry.register("lookup", target=str(tiny_models["target"]), draft=str(tiny_models["draft"]),
                          method="ngram", num_speculative_tokens=3)


def test_version_is_immutable(db_url, tiny_models):
    registry = Registry(db_url)
    version = registry.register("imm", target=str(tiny_models["target"]), draft=str(tiny_models["draft"]),
                                num_speculative_tokens=4).version
    with pytest.raises(dataclasses.FrozenInstanceError):
        version.config = None  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        version.target.fingerprint.weights_sha256 = "0" * 64  # type: ignore[misc]
    # Through the store's own session: any change to a bound column is refused at flush.
    with pytest.raises(ImmutableError, match="num_speculative_tokens"):
        with registry.store.session(write=True) as session:
            row = session.scalar(select(PairVersionRow))
            row.num_speculative_tokens = 8
    with pytest.raises(ImmutableError, match="target"):
        with registry.store.session(write=True) as session:
            row = session.scalar(select(PairVersionRow))
            row.target = {**row.target, "path": "/elsewhere"}
    assert registry.get("imm@1").to_dict() == version.to_dict()


def test_lifecycle_moves_are_checked_and_audited(db_url, tiny_models):
    registry = Registry(as_user(db_url, "bob"), user="bob")
    registry.register("life", target=str(tiny_models["target"]), draft=str(tiny_models["draft"]),
                      num_speculative_tokens=2)
    with pytest.raises(IllegalTransitionError, match="registered to approved"):
        registry.move("life@1", PairState.APPROVED, action="approve")
    registry.move("life@1", PairState.VALIDATED, action="validate", reason="all checks pass")
    registry.move("life@1", PairState.APPROVED, action="approve")
    registry.retire("life@1", reason="superseded")
    with pytest.raises(IllegalTransitionError, match="retired"):
        registry.move("life@1", PairState.VALIDATED, action="validate")
    events = registry.history("life")
    assert [(e.action, e.from_state, e.to_state) for e in events] == [
        ("register", None, "registered"), ("validate", "registered", "validated"),
        ("approve", "validated", "approved"), ("retire", "approved", "retired")]
    assert all(e.actor == "bob" for e in events)
    assert registry.verify_audit() == (4, None)


def test_audit_chain_detects_edit_and_delete(db_url, tiny_models):
    registry = Registry(db_url)
    for k in (1, 2, 3):
        registry.register("audit", target=str(tiny_models["target"]), draft=str(tiny_models["draft"]),
                          num_speculative_tokens=k)
    assert registry.verify_audit() == (3, None)
    engine = create_engine(db_url)
    with engine.begin() as connection:
        connection.execute(text("UPDATE audit_events SET actor = 'mallory' WHERE id = 2"))
    checked, problem = registry.verify_audit()
    assert checked == 1 and "event 2" in problem and "edited" in problem
    with engine.begin() as connection:
        connection.execute(text("UPDATE audit_events SET actor = 'tester' WHERE id = 2"))
    assert registry.verify_audit() == (3, None)
    with engine.begin() as connection:
        connection.execute(text("DELETE FROM audit_events WHERE id = 2"))
    checked, problem = registry.verify_audit()
    assert checked == 1 and "event 3" in problem and "deleted" in problem
    engine.dispose()


def test_failed_register_leaves_no_rows(db_url, tiny_models, tmp_path):
    registry = Registry(db_url)
    broken = tmp_path / "broken"
    shutil.copytree(tiny_models["draft"], broken)
    (broken / "model.safetensors").write_bytes(b"\xff" * 16)
    with pytest.raises(ModelReferenceError, match="corrupt safetensors header"):
        registry.register("bad", target=str(tiny_models["target"]), draft=str(broken), num_speculative_tokens=4)
    assert count_rows(db_url) == {"pairs": 0, "pair_versions": 0, "audit_events": 0}


def test_unknown_references(db_url, tiny_models):
    registry = Registry(db_url)
    with pytest.raises(NotFoundError, match="unknown pair nope"):
        registry.get("nope@1")
    registry.register("known", target=str(tiny_models["target"]), draft=str(tiny_models["draft"]),
                      num_speculative_tokens=4)
    with pytest.raises(NotFoundError, match="unknown version known@7"):
        registry.get("known@7")
    assert registry.get("known").version == 1


@pytest.mark.parametrize("text,expected", [
    ("a", ("a", None, None)), ("pair.v2@3", ("pair.v2", 3, None)), ("p@v12", ("p", 12, None)),
    ("p@production", ("p", None, "production")),
])
def test_parse_ref(text, expected):
    ref = parse_ref(text)
    assert (ref.name, ref.version, ref.environment) == expected


@pytest.mark.parametrize("text", ["", "Upper", "-x", "a" * 65, "a@", "a@0", "a@Prod!", "sp ace"])
def test_parse_ref_rejects(text):
    with pytest.raises(UsageError):
        parse_ref(text)

"""Registering the pair kinds that draft from the target's hidden states (EAGLE-3, Medusa, MTP):
the head is read and checked against the target at registration, what was read is bound into the
version (and its binding hash), and a head that does not fit is refused naming the field, on
SQLite and PostgreSQL, through the API and the real CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session

from headfiles import HIDDEN, LAYERS, write_eagle3, write_medusa, write_target
from pgroles import as_user
from specreg.api import Registry
from specreg.errors import HeadMismatchError, UsageError
from specreg.registry.store.entities import SpecMethod
from specreg.registry.store.orm import PairVersionRow

from clirun import one_line, run  # tests/ is on sys.path (tests/conftest.py)


@pytest.fixture
def head_models(tmp_path, monkeypatch):
    """A target at models/target (the name the heads declare as their verifier) and heads for it."""
    monkeypatch.chdir(tmp_path)
    target = write_target(tmp_path / "models" / "target")
    mtp_tensors = {f"model.layers.{LAYERS}.{name}": np.zeros((HIDDEN, 2 * HIDDEN) if name == "eh_proj.weight" else 4,
                                                              np.float32)
                   for name in ("eh_proj.weight", "enorm.weight", "hnorm.weight", "shared_head.norm.weight")}
    return {
        "target": target,
        "eagle3": write_eagle3(tmp_path / "eagle3-head"),
        "medusa": write_medusa(tmp_path / "medusa-heads", heads=3),
        "mtp": write_target(tmp_path / "models" / "target-mtp", config_extra={"num_nextn_predict_layers": 1},
                            extra_tensors=mtp_tensors),
    }


def stored_row(db_url: str, version_id: int) -> PairVersionRow:
    engine = create_engine(db_url)
    with Session(engine) as session:
        row = session.scalar(select(PairVersionRow).where(PairVersionRow.id == version_id))
        session.expunge_all()
    engine.dispose()
    return row


def test_an_eagle3_head_is_read_checked_and_bound(db_url, head_models):
    registry = Registry(as_user(db_url, "alice"), user="alice")
    version = registry.register("chat", target="models/target", draft=str(head_models["eagle3"]), method="eagle3",
                                num_speculative_tokens=3).version
    config = version.config
    assert config.method is SpecMethod.EAGLE3 and config.num_speculative_tokens == 3 and config.tree is None
    head = config.head
    assert (head["layout"], head["hidden_size"], head["draft_vocab_size"], head["target_vocab_size"]) == \
        ("speculators", 16, 24, 40)
    assert head["fit"]["aux_layer_ids"] == [1, 3, 4] and head["fit"]["verifier_matched"] is True
    assert "path" not in head  # a location is not an identity
    assert [t["name"] for t in head["tensors"]] == ["d2t", "fc.weight", "layers.0.hidden_norm.weight",
                                                   "layers.0.self_attn.q_proj.weight", "lm_head.weight",
                                                   "norm.weight", "t2d"]
    assert version.draft.fingerprint.tokenizer_sha256 is None  # a head has no tokenizer of its own
    row = stored_row(db_url, version.id)  # the real row holds what the entity says
    assert row.method == "eagle3" and row.head == head and row.tree is None
    assert registry.get("chat@1").config == config
    # the same files again: the same binding, nothing new
    again = registry.register("chat", target="models/target", draft=str(head_models["eagle3"]), method="eagle3",
                              num_speculative_tokens=3)
    assert not again.created and again.version.binding_sha256 == version.binding_sha256


def test_mtp_binds_the_target_tensors_that_form_the_module(db_url, head_models):
    version = Registry(as_user(db_url, "alice"), user="alice").register(
        "chat-mtp", target=str(head_models["mtp"]), method="mtp", num_speculative_tokens=1).version
    assert version.draft is None
    assert version.config.head["layout"] == "mtp:deepseek"
    assert [t["name"] for t in version.config.head["tensors"]] == [
        "model.layers.6.eh_proj.weight", "model.layers.6.enorm.weight", "model.layers.6.hnorm.weight",
        "model.layers.6.shared_head.norm.weight"]


def test_medusa_with_a_tree(db_url, head_models):
    registry = Registry(as_user(db_url, "alice"), user="alice")
    version = registry.register("chat-medusa", target="models/target", draft=str(head_models["medusa"]),
                                method="medusa", tree="[[0],[1],[0,0],[0,1],[0,0,0]]").version
    assert version.config.tree == ((0,), (1,), (0, 0), (0, 1), (0, 0, 0))
    assert version.config.num_speculative_tokens == 3  # the tree's depth
    assert stored_row(db_url, version.id).tree == [[0], [1], [0, 0], [0, 1], [0, 0, 0]]
    # another tree is another binding
    other = registry.register("chat-medusa", target="models/target", draft=str(head_models["medusa"]),
                              method="medusa", tree="[[0],[0,0]]").version
    assert other.version == 2 and other.binding_sha256 != version.binding_sha256


@pytest.mark.parametrize("tree, message", [
    ("[[0],[0,0],[0,0,0],[0,0,0,0]]", "tree depth 4 needs 4 Medusa heads; .* has medusa_num_heads = 3"),
    ("[[0],[1,0]]", r"node \[1, 0\]: its parent \[1\] is not in the tree"),
    ("[[0],[0]]", "a path is listed twice"),
    ("[[0],[-1]]", "top-i indices"),
    ("[[0],[true]]", "top-i indices"),
    ("[]", "a non-empty list of paths"),
    ("{", "not JSON"),
])
def test_a_bad_tree_is_refused_before_any_row(tmp_path, head_models, tree, message):
    registry = Registry(f"sqlite:///{tmp_path / 'r.db'}", user="alice")
    with pytest.raises(UsageError, match=message):
        registry.register("chat-medusa", target="models/target", draft=str(head_models["medusa"]), method="medusa",
                          tree=tree)
    assert registry.list_summaries() == []


def test_the_method_decides_what_draft_means(tmp_path, head_models):
    registry = Registry(f"sqlite:///{tmp_path / 'r.db'}", user="alice")
    with pytest.raises(UsageError, match=r"num_speculative_tokens is missing: pass -k N \(or --tree"):
        registry.register("x", target="models/target", draft=str(head_models["medusa"]), method="medusa")
    with pytest.raises(UsageError, match="method eagle3 needs --draft"):
        registry.register("x", target="models/target", method="eagle3", num_speculative_tokens=3)
    with pytest.raises(UsageError, match="method mtp drafts with the layers inside the target"):
        registry.register("x", target=str(head_models["mtp"]), draft=str(head_models["eagle3"]), method="mtp",
                          num_speculative_tokens=1)
    with pytest.raises(UsageError, match="--tree applies to methods eagle3 and medusa"):
        registry.register("x", target="models/target", method="ngram", num_speculative_tokens=3, tree="[[0]]")
    with pytest.raises(UsageError, match="differs from the tree's depth 2"):
        registry.register("x", target="models/target", draft=str(head_models["medusa"]), method="medusa",
                          num_speculative_tokens=3, tree="[[0],[0,0]]")
    with pytest.raises(UsageError, match="--allow-verifier-mismatch applies to methods eagle3, medusa and mtp"):
        registry.register("x", target="models/target", method="ngram", num_speculative_tokens=3,
                          allow_verifier_mismatch=True)


def test_a_head_for_another_target_is_refused_unless_allowed_and_then_recorded(tmp_path, head_models):
    other = write_eagle3(tmp_path / "other-head", verifier="models/another-target")
    registry = Registry(f"sqlite:///{tmp_path / 'r.db'}", user="alice")
    with pytest.raises(HeadMismatchError, match="models/another-target"):
        registry.register("chat", target="models/target", draft=str(other), method="eagle3", num_speculative_tokens=3)
    assert registry.list_summaries() == []
    version = registry.register("chat", target="models/target", draft=str(other), method="eagle3",
                                num_speculative_tokens=3, allow_verifier_mismatch=True).version
    fit = version.config.head["fit"]
    assert fit["verifier_matched"] is False and fit["allow_verifier_mismatch"] is True
    assert any("models/another-target" in note for note in fit["notes"])


def test_cli_registers_each_kind_and_refuses_a_wrong_head_in_one_line(tmp_path, head_models):
    db = f"sqlite:///{tmp_path / 'r.db'}"
    out = run("register", "chat", "--target", "models/target", "--draft", str(head_models["eagle3"]),
              "--method", "eagle3", "-k", "3", "--json", "--db", db)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["config"]["head"]["fit"]["aux_layer_ids"] == [1, 3, 4]
    out = run("register", "chat-medusa", "--target", "models/target", "--draft", str(head_models["medusa"]),
              "--method", "medusa", "--tree", "[[0],[1],[0,0]]", "--db", db)
    assert out.returncode == 0, out.stderr
    shown = run("show", "chat-medusa@1", "--db", db)
    assert "tree: 3 nodes, depth 2: [[0],[1],[0,0]]" in shown.stdout
    assert "head            medusa:" in shown.stdout and "(matches the target)" in shown.stdout

    wide = write_eagle3(tmp_path / "wide-head", hidden=32)  # a head for a 32-wide target
    out = run("register", "chat", "--target", "models/target", "--draft", str(wide), "--method", "eagle3",
              "-k", "3", "--db", db)
    one_line(out, 1, "hidden")
    assert out.stderr.startswith("specreg: error: ")


def test_a_head_folder_with_tokenizer_files_is_not_registered_as_a_draft_model(tmp_path, head_models):
    # speculators copies the verifier's tokenizer beside an EAGLE-3 head: the folder then passes for
    # a draft model (recorded as Eagle3Speculator, vocab null) and fails later on config fields
    from headfiles import token_vocab, write_tokenizer

    from specreg.core.heads import head_in_place_of_a_model

    eagle1 = tmp_path / "eagle1-head"
    eagle1.mkdir()
    (eagle1 / "config.json").write_text(json.dumps({"architectures": ["EagleLlamaForCausalLM"], "num_hidden_layers": 1}))
    original = tmp_path / "original-eagle3"
    original.mkdir()
    (original / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1,
                                                      "draft_vocab_size": 24}))
    for folder in (head_models["eagle3"], head_models["medusa"], eagle1, original):
        write_tokenizer(folder, token_vocab())
    db = f"sqlite:///{tmp_path / 'r.db'}"
    for folder, what, how in ((head_models["eagle3"], "a speculators 'eagle3' head", "--method eagle3"),
                              (head_models["medusa"], "Medusa heads (medusa_num_heads)", "--method medusa"),
                              (eagle1, "an EAGLE (1/2) head", "specreg registers EAGLE-3, Medusa and MTP heads"),
                              (original, "an EAGLE-3 head (architectures ['LlamaForCausalLM'], draft_vocab_size 24)",
                               "--method eagle3")):
        out = run("register", "chat", "--target", "models/target", "--draft", str(folder), "-k", "3", "--db", db)
        one_line(out, 2, f"{folder / 'config.json'}: {what}", how, "not a draft model")
    assert Registry(db).list_summaries() == []
    assert head_in_place_of_a_model(head_models["target"]) is None  # a causal LM is one

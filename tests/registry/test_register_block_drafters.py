"""Registering DFlash and DSpark pairs through the real CLI: k defaults to the head's draft length,
what was read (block, target layers in each numbering) is bound into the version, and a head that
does not fit, a k that disagrees, or a variant no engine runs is refused in one line, exit 1,
leaving no row."""

from __future__ import annotations

import json

import pytest

from headfiles import VOCAB, write_block_drafter, write_target

from clirun import one_line, run  # tests/ is on sys.path (tests/conftest.py)


@pytest.fixture
def db(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_target(tmp_path / "models" / "target")
    return f"sqlite:///{tmp_path / 'r.db'}"


def register(db, head, method, *extra):
    return run("register", "chat", "--target", "models/target", "--draft", str(head), "--method", method,
               "--json", "--db", db, *extra)


@pytest.mark.parametrize("kind, layout, k", [("dflash", "speculators", 3), ("dflash", "native", 3),
                                             ("dspark", "speculators", 4), ("dspark", "native", 4)])
def test_k_defaults_to_the_heads_draft_length_and_the_block_is_bound(tmp_path, db, kind, layout, k):
    declared = [2, 4] if layout == "speculators" else [1, 3]
    head = write_block_drafter(tmp_path / "head", kind=kind, layout=layout, layer_ids=declared)
    out = register(db, head, kind)
    assert out.returncode == 0, out.stderr
    config = json.loads(out.stdout)["config"]
    assert (config["method"], config["num_speculative_tokens"]) == (kind, k)
    assert config["head"]["block"]["block_size"] == 4 and config["head"]["block"]["mask_token_id"] == 39
    assert config["head"]["fit"]["aux_layer_ids"] == [2, 4]
    shown = run("show", "chat@1", "--db", db).stdout
    assert f"  block           4 tokens, {k} drafts a step" in shown
    # the same k given explicitly is the same version
    again = register(db, head, kind, "-k", str(k))
    assert again.returncode == 0 and json.loads(again.stdout)["version"] == json.loads(out.stdout)["version"]


def test_refusals_are_one_line_and_leave_no_row(tmp_path, db):
    head = write_block_drafter(tmp_path / "head", block_size=8)
    one_line(register(db, head, "dflash", "-k", "4"), 1,
             "specreg: error: num_speculative_tokens 4 disagrees with the head: block_size 8 drafts 7 tokens a step "
             "(block_size - 1: the anchor fills slot 0); omit -k or pass -k 7")
    outside = write_block_drafter(tmp_path / "mask", mask_token_id=VOCAB + 5)
    one_line(register(db, outside, "dflash"), 1,
             f"mask_token_id {VOCAB + 5} is outside the target's vocabulary (vocab_size {VOCAB})")
    gated = write_block_drafter(tmp_path / "gated", kind="dspark", config_extra={"markov_head_type": "rnn"})
    one_line(register(db, gated, "dspark"), 1, "markov_head_type 'rnn' is a DSpark variant no engine specreg "
                                               "targets runs")
    one_line(register(db, head, "dspark"), 1, "holds dflash head(s) (speculators layout), not dspark")
    assert json.loads(run("list", "--json", "--db", db).stdout) == []

"""Registering P-EAGLE pairs (speculators' `peagle` heads) through the real CLI: the head is read
as an EAGLE-3 head plus its mask token, bound into the version and shown; registering it as eagle3,
or a head vLLM 0.33 could not load, is refused in one line, exit 1, leaving no row."""

from __future__ import annotations

import json

import pytest

from headfiles import VOCAB, write_eagle3, write_peagle, write_target

from clirun import one_line, run  # tests/ is on sys.path (tests/conftest.py)


@pytest.fixture
def db(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_target(tmp_path / "models" / "target")
    return f"sqlite:///{tmp_path / 'r.db'}"


def register(db, head, method, *extra):
    return run("register", "chat", "--target", "models/target", "--draft", str(head), "--method", method,
               "--json", "--db", db, *extra)


def test_a_peagle_head_is_registered_with_its_mask_token_bound(tmp_path, db):
    out = register(db, write_peagle(tmp_path / "head"), "peagle", "-k", "5")
    assert out.returncode == 0, out.stderr
    config = json.loads(out.stdout)["config"]
    assert (config["method"], config["num_speculative_tokens"]) == ("peagle", 5)
    assert config["head"]["parallel"] == {"mask_token_id": VOCAB - 1}
    assert config["head"]["method"] == "peagle" and config["head"]["fit"]["aux_layer_ids"] == [1, 3, 4]
    assert config["head"]["fit"]["layers_fed"]["vllm"] == [1, 3, 4]
    shown = run("show", "chat@1", "--db", db).stdout
    line = f"  parallel        all k drafts in one forward, the slots after the first fed mask token {VOCAB - 1}"
    assert line in shown


def test_refusals_are_one_line_and_leave_no_row(tmp_path, db):
    head = write_peagle(tmp_path / "head")
    one_line(register(db, head, "eagle3", "-k", "3"), 1, "holds peagle head(s) (speculators layout), not eagle3")
    one_line(register(db, head, "peagle", "--tree", "[[0],[1]]"), 2, "--tree applies to methods")
    no_mask = write_peagle(tmp_path / "no-mask", mask_token_id=None)
    one_line(register(db, no_mask, "peagle", "-k", "3"), 1, "mask_token_id is missing: vLLM 0.33 reads the token")
    eagle3 = write_eagle3(tmp_path / "eagle3")
    one_line(register(db, eagle3, "peagle", "-k", "3"), 1, "holds eagle3 head(s) (speculators layout), not peagle")
    assert json.loads(run("list", "--json", "--db", db).stdout) == []

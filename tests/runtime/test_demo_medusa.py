"""The demo Medusa builder on the tiny target (small settings): it trains, saves a head
directory the runtime and the registration reader accept, and reuses it while its key holds."""

from __future__ import annotations

import json

import pytest

from specreg.builders import demo_medusa


@pytest.mark.slow
def test_build_then_reuse_then_rebuild_on_a_new_setting(tmp_path, tiny_dir, monkeypatch):
    from specreg.core.heads import read_head
    from specreg.runtime.loading import load_model
    from specreg.runtime.methods.medusa import WEIGHTS_FILE, load_medusa_heads

    monkeypatch.setattr(demo_medusa, "MEDUSA_WINDOWS", 8)
    monkeypatch.setattr(demo_medusa, "MEDUSA_TRAINING", (20, 64))
    out = demo_medusa.build_demo_medusa(tmp_path / "medusa", tiny_dir / "target")
    weights = out / WEIGHTS_FILE
    built_at = weights.stat().st_mtime_ns
    assert read_head(out).num_heads == demo_medusa.MEDUSA_HEADS
    target = load_model(tiny_dir / "target")
    heads = load_medusa_heads(out, target)
    untouched = target.get_output_embeddings().weight
    assert not all(bool((head[-1].weight == untouched).all()) for head in heads.heads)  # training moved them
    assert demo_medusa.build_demo_medusa(tmp_path / "medusa", tiny_dir / "target") == out
    assert weights.stat().st_mtime_ns == built_at  # cached
    monkeypatch.setattr(demo_medusa, "MEDUSA_TRAINING", (21, 64))
    demo_medusa.build_demo_medusa(tmp_path / "medusa", tiny_dir / "target")
    assert weights.stat().st_mtime_ns != built_at  # a new setting is a new build


@pytest.mark.slow
def test_demo_pair_cli_builds_medusa_heads_and_prints_a_registrable_tree(tmp_path, small_demo_dir, shrunk_demo,
                                                                         monkeypatch):
    from click.testing import CliRunner

    from specreg.cli import cli

    monkeypatch.setattr(demo_medusa, "MEDUSA_WINDOWS", 4)
    monkeypatch.setattr(demo_medusa, "MEDUSA_TRAINING", (5, 32))
    runner = CliRunner()
    weights = small_demo_dir / "target" / "model.safetensors"
    built_at = weights.stat().st_mtime_ns
    built = runner.invoke(cli, ["demo-pair", str(small_demo_dir), "--method", "medusa"])
    assert built.exit_code == 0, built.output
    assert weights.stat().st_mtime_ns == built_at  # the pair was reused, only the heads were built
    lines = dict(line.split(":", 1) for line in built.stdout.splitlines())
    heads, tree = lines["medusa"].strip(), lines["tree"].strip()
    assert heads == str(small_demo_dir / "medusa")
    registered = runner.invoke(cli, ["register", "demo-medusa", "--target", lines["target"].strip(), "--draft", heads,
                                     "--method", "medusa", "--tree", tree,
                                     "--db", f"sqlite:///{tmp_path / 'registry.db'}", "--json"])
    assert registered.exit_code == 0, registered.output
    assert json.loads(registered.stdout)["config"]["tree"] == json.loads(tree)

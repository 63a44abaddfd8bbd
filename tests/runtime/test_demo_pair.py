"""The demo pair builder: corpus coverage, a (shrunken) full build, the cache."""

from __future__ import annotations

from specreg.builders import demo_pair


def test_corpus_covers_the_five_workloads_and_the_golden_prompts():
    corpus = demo_pair.demo_corpus(documents=500, seed=3)
    assert corpus == demo_pair.demo_corpus(documents=500, seed=3)
    text = "\n".join(corpus)
    for marker in ("thank you for reaching out", "summarize:", "def ", "dear ", "once upon a time"):
        assert marker in text
    assert "<|user|>\n" in text and "<|assistant|>\n" in text  # chat turns through the template
    golden = demo_pair.golden_texts()
    assert any("do you ship to canada?" in t for t in golden)
    assert any(t.startswith("def add(a, b):\n") for t in golden)


def test_build_then_reuse_the_cache(small_demo_dir, shrunk_demo):
    # the real shapes and step counts take minutes; the same code path with a tiny budget, built
    # once per session (small_demo_dir)
    target_dir, draft_dir = demo_pair.build_demo_pair(small_demo_dir)
    from specreg.runtime.decode_config import DecodeConfig
    from specreg.runtime.generate import speculative_generate
    from specreg.runtime.methods import load_pair

    pair = load_pair(target_dir, draft_dir)
    assert pair.tokenizer.chat_template == demo_pair.CHAT_TEMPLATE
    assert pair.target.config.num_hidden_layers == 2 and pair.draft.config.num_hidden_layers == 1
    ids = pair.tokenizer.apply_chat_template([{"role": "user", "content": "how do i reset my password?"}],
                                             tokenize=False, add_generation_prompt=True)
    result = speculative_generate(pair, pair.tokenizer(ids)["input_ids"], DecodeConfig(k=3, max_new_tokens=8))
    assert 1 <= len(result.token_ids) <= 8
    weights = target_dir / "model.safetensors"
    built_at = weights.stat().st_mtime_ns
    assert demo_pair.build_demo_pair(small_demo_dir) == (target_dir, draft_dir)
    assert weights.stat().st_mtime_ns == built_at  # reused, not retrained


def test_cache_key_follows_code_settings_and_golden_prompts(tmp_path, monkeypatch):
    import shutil
    from pathlib import Path

    key = demo_pair.cache_key()
    assert key == demo_pair.cache_key()
    monkeypatch.setattr(demo_pair, "DRAFT_TRAINING", (1, 1))
    assert demo_pair.cache_key() != key  # a changed budget is a different pair
    monkeypatch.undo()

    # copies of the builder and the golden prompts laid out as in the repo: editing either changes the key
    source = Path(demo_pair.__file__)
    shutil.copytree(source.parent.parent / "golden_prompts", tmp_path / "golden_prompts")
    (tmp_path / "runtime").mkdir()
    copy = tmp_path / "runtime" / "demo_pair.py"
    copy.write_bytes(source.read_bytes())
    monkeypatch.setattr(demo_pair, "__file__", str(copy))
    assert demo_pair.cache_key() == key
    copy.write_text(source.read_text() + "\n# a changed line\n")
    edited_code = demo_pair.cache_key()
    assert edited_code != key
    golden = tmp_path / "golden_prompts" / "default.yaml"
    golden.write_text(golden.read_text() + "\n")
    assert demo_pair.cache_key() not in (key, edited_code)

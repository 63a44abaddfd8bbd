"""The llamacpp export format rendered and run by a real shell (the GGUF conversion, the lock over
the GGUF files and llama-server itself run in tests/engines/test_llamacpp.py)."""

from __future__ import annotations

import pytest
from exportcase import check_command, make_pair

from specreg.errors import UsageError
from specreg.registry.deploy.exports import engine_schema, render_export
from specreg.registry.store.entities import SpecMethod


def test_llama_server_command_for_a_draft_pair(draft_pair, baselines, run_script):
    files = dict(render_export(draft_pair, baselines, "llamacpp", approved=True,
                               options={"parallel": 4, "threads": 2, "port": 8088}))
    argv = run_script(files["llama-server.sh"])
    flags = check_command(argv, engine_schema("llamacpp"))
    assert flags == {
        "--model": "gguf/target/model-f32.gguf", "--spec-draft-model": "gguf/draft/model-f32.gguf",
        "--spec-type": "draft-simple", "--spec-draft-n-max": "4", "--spec-draft-n-min": "0",
        "--spec-draft-p-min": "0", "--parallel": "4", "--threads": "2", "--metrics": "", "--alias": "chat-pair",
        "--host": "0.0.0.0", "--port": "8088"}
    script = files["llama-server.sh"]
    assert "max_batch_size_for_speculation=16 is not expressed here" in script
    assert "--target gguf/target --draft gguf/draft" in script  # the verify line names the GGUF folders


def test_bf16_gguf_and_bad_options(draft_pair, baselines, run_script):
    files = dict(render_export(draft_pair, baselines, "llamacpp", approved=True, options={"gguf_type": "bf16"}))
    flags = check_command(run_script(files["llama-server.sh"]), engine_schema("llamacpp"))
    assert flags["--model"] == "gguf/target/model-bf16.gguf" and "--threads" not in flags
    with pytest.raises(UsageError, match="gguf_type='q4_0' must be one of f32, bf16, f16"):
        render_export(draft_pair, baselines, "llamacpp", approved=True, options={"gguf_type": "q4_0"})
    with pytest.raises(UsageError, match="parallel and threads must be >= 1"):
        render_export(draft_pair, baselines, "llamacpp", approved=True, options={"parallel": 0})


def test_other_methods_are_refused(baselines):
    # EAGLE-3 heads are exported (tests/engines/test_llamacpp_heads.py), n-gram drafting is not
    with pytest.raises(UsageError, match=r"cannot be exported to llamacpp: this export writes llama-server's separate "
                                         r"draft model \(--spec-type draft-simple\) and EAGLE-3 heads"):
        render_export(make_pair(SpecMethod.NGRAM), baselines, "llamacpp", approved=True)

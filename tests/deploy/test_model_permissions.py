"""Model files another user cannot read. The verify image runs as user 65534; before the fix, a
shard written 0600 (transformers writes a sharded checkpoint's shards so, and the demo's real
pair was saved that way) made `specreg verify` die with a 25-line PermissionError traceback.
Now it is one line naming the file, exit 1, and the real pair's builder writes readable files.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from clirun import SPECREG, one_line, run_specreg  # tests/ is on sys.path (tests/conftest.py)

# what a process needs to read a file whose mode does not let it: without these, root reads a
# 0600 file of another owner no more than the verify image's user 65534 does
DAC = "dac_override,dac_read_search"


def unreadable_to(path, command: list) -> list:
    """``command`` as a process that cannot read ``path``: as root, with the file given to user
    65534 and the capabilities that bypass file modes dropped (setpriv); otherwise mode 0."""
    if os.geteuid() != 0:
        path.chmod(0)
        return command
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: no way to make a file unreadable to this test")
    os.chown(path, 65534, 65534)
    path.chmod(0o600)
    return ["setpriv", f"--inh-caps=-{DAC.replace(',', ',-')}", f"--bounding-set=-{DAC.replace(',', ',-')}",
            *command]


def test_verify_names_a_model_file_it_cannot_read_in_one_line(tiny_models, tmp_path):
    target = tmp_path / "target"
    shutil.copytree(tiny_models["target"], target)
    db = f"sqlite:///{tmp_path / 'r.db'}"
    assert run_specreg(["register", "p", "--target", target, "--draft", tiny_models["draft"], "-k", "3",
                        "--db", db]).returncode == 0
    out = tmp_path / "out"
    assert run_specreg(["export", "p@1", "--format", "vllm", "--force", "-o", out, "--db", db]).returncode == 0
    weights = target / "model.safetensors"
    command = unreadable_to(weights, [*SPECREG, "verify", "--lock", str(out / "specreg.lock.json"), "--target",
                                      str(target), "--draft", str(tiny_models["draft"]), "--allow-unsigned",
                                      "--allow-unapproved"])
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    one_line(result, 1, f"target file {weights}: cannot read (Permission denied) as uid {os.geteuid()}: "
                        "the user that verifies (and serves) needs read access to the model files")
    assert "Traceback" not in result.stderr


def test_the_real_pair_builder_saves_shards_readable(tiny_models, tmp_path):
    """transformers' save_pretrained writes each shard of a sharded checkpoint 0600."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specreg.builders.real_pair import save_readable

    model = AutoModelForCausalLM.from_pretrained(tiny_models["target"])
    tokenizer = AutoTokenizer.from_pretrained(tiny_models["target"])
    umask = os.umask(0o022)
    try:
        save_readable(model, tokenizer, tmp_path / "saved", "20KB")
    finally:
        os.umask(umask)
    shards = sorted((tmp_path / "saved").glob("model-*.safetensors"))
    assert len(shards) > 1  # sharded, as the real pair is
    modes = {path.name: oct(path.stat().st_mode & 0o777) for path in (tmp_path / "saved").iterdir()}
    assert set(modes.values()) == {"0o644"}, modes

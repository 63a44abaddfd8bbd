"""Model paths in exports: a local folder registered by a relative path is recorded
and exported by its absolute path, never as typed (`exec vllm serve tiny/target` worked only
from that folder and read like a hub id); headers carry no Python reprs."""

from __future__ import annotations

import dataclasses
import json
import os

from exportcase import check_command, make_pair

from specreg.api import Registry
from specreg.core.types import ModelRef
from specreg.errors import SpecregError
from specreg.registry.deploy.exports import FORMATS, engine_schema, render_export
from specreg.registry.store.entities import SpecMethod


def test_a_relative_folder_is_registered_by_its_absolute_path(tiny_models, tmp_path, monkeypatch):
    monkeypatch.chdir(tiny_models["target"].parent)
    registry = Registry(f"sqlite:///{tmp_path / 'registry.db'}", user="alice")
    version = registry.register("rel", target="target", draft=f"./{tiny_models['draft'].name}",
                                num_speculative_tokens=2).version
    assert version.target.reference == str(tiny_models["target"]) == os.path.abspath("target")
    assert version.draft.reference == str(tiny_models["draft"])
    assert version.target.revision is None and version.target.path == str(tiny_models["target"].resolve())


def test_an_old_relative_reference_is_exported_by_its_recorded_absolute_path(baselines, run_script):
    pair = make_pair(SpecMethod.DRAFT_MODEL)
    relative = dataclasses.replace(pair, target=ModelRef("tiny/target", "/srv/models/tiny/target", None,
                                                         pair.target.fingerprint),
                                   draft=ModelRef("tiny/draft", "/srv/models/tiny/draft", None, pair.draft.fingerprint))
    files = dict(render_export(relative, baselines, "vllm", approved=True))
    argv = run_script(files["vllm-serve.sh"])
    flags = check_command(argv, engine_schema("vllm"))
    assert argv[2] == "/srv/models/tiny/target" and "--revision" not in flags
    assert json.loads(flags["--speculative-config"])["model"] == "/srv/models/tiny/draft"
    assert "target: /srv/models/tiny/target (local folder)" in files["vllm-serve.sh"]


def test_no_python_none_in_any_exported_file(baselines):
    pair = make_pair(SpecMethod.DRAFT_MODEL, max_batch=None)  # every optional setting unset
    for fmt in FORMATS:
        try:
            files = dict(render_export(pair, baselines, fmt, approved=True))
        except SpecregError:  # a format that refuses this pair (or needs options) writes nothing
            continue
        for name, text in files.items():
            assert "None" not in text, f"{fmt}/{name} prints Python's None"
    header = dict(render_export(pair, baselines, "vllm", approved=True))["vllm-serve.sh"]
    assert "speculative config: method=draft_model num_speculative_tokens=4\n" in header

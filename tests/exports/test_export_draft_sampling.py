"""An export serves the draft sampling its baselines' sampled records were measured with.

vLLM 0.33 drafts the argmax with a point-mass q by default (SpeculativeConfig.draft_sample_method
"greedy") and draws from q only under "probabilistic": its exports write the key explicitly, as the
baselines recorded it, and read it back. SGLang, TensorRT-LLM and llama.cpp draft the argmax only,
so baselines measured drafting from q are refused there for the methods whose drafts carry a q."""

from __future__ import annotations

import json

import pytest
from exportcase import BASELINES, k8s_engine, make_pair

from specreg.errors import EngineRefusal, ReadBackError
from specreg.registry.deploy import read_back
from specreg.registry.deploy.exports import plan_export, render_files
from specreg.registry.store.entities import SpecMethod

MEASURED = {"greedy": {**BASELINES, "draft_sampling": "greedy"},
            "probabilistic": {**BASELINES, "draft_sampling": "probabilistic"},
            # no sampled record measured, or recorded before the setting: vLLM's default
            "not recorded": dict(BASELINES)}


def exported_config(method, baselines, fmt="vllm"):
    options = {"model_volume": "pvc:models"} if fmt == "k8s-vllm" else None
    plan = plan_export(make_pair(method), baselines, fmt, approved=True, options=options)
    files = dict(render_files(plan))
    if fmt == "k8s-vllm":
        argv = k8s_engine(files["k8s-vllm.yaml"])[1]
        return plan, files, json.loads(argv[argv.index("--speculative-config") + 1])
    return plan, files, json.loads(files["vllm-speculative-config.json"])


@pytest.mark.parametrize("fmt", ["vllm", "k8s-vllm"])
@pytest.mark.parametrize("measured, written", [("greedy", "greedy"), ("probabilistic", "probabilistic"),
                                               ("not recorded", "greedy")])
def test_vllm_writes_the_draft_sampling_the_baselines_were_measured_with(fmt, measured, written):
    plan, files, speculative = exported_config(SpecMethod.DRAFT_MODEL, MEASURED[measured], fmt)
    assert speculative["draft_sample_method"] == written
    read = plan.engine.read_back(plan, files)
    assert [value.value for value in read if value.field == "draft_sampling"] == [written] * (2 if fmt == "vllm" else 1)
    read_back.check(plan, read)


def test_an_ngram_export_writes_no_draft_sampling():
    # n-gram drafts carry no q: vLLM's n-gram proposer never reads the key
    _, files, speculative = exported_config(SpecMethod.NGRAM, MEASURED["probabilistic"])
    assert "draft_sample_method" not in speculative
    assert "draft_sample_method" not in files["vllm-serve.sh"]


@pytest.mark.parametrize("edit, read", [('"draft_sample_method": "greedy"', "'greedy'"),
                                        (None, "'greedy'")])
def test_a_script_drafting_otherwise_is_refused_when_read_back(edit, read):
    plan, files, _ = exported_config(SpecMethod.DRAFT_MODEL, MEASURED["probabilistic"])
    written = '"draft_sample_method": "probabilistic"'
    script = files["vllm-serve.sh"]
    assert written in script
    if edit is None:  # the key dropped: vLLM drafts with its default
        script = script.replace(", " + written, "")
    else:
        script = script.replace(written, edit)
    files["vllm-serve.sh"] = script
    with pytest.raises(ReadBackError) as info:
        read_back.check(plan, plan.engine.read_back(plan, files))
    assert f"vllm-serve.sh --speculative-config draft_sample_method reads back {read}, registered 'probabilistic'" \
        in str(info.value)


@pytest.mark.parametrize("fmt, cites", [
    ("sglang", "sglang/srt/arg_groups/fields/spec.py:117-119"),
    ("trtllm", "tensorrt_llm/_torch/speculative/eagle3.py Eagle3OneModelWorker.draft_decoder"),
    ("llamacpp", "common/sampling.cpp:696"),
])
def test_engines_drafting_the_argmax_only_refuse_baselines_drawn_from_q(fmt, cites):
    with pytest.raises(EngineRefusal) as info:
        plan_export(make_pair(SpecMethod.DRAFT_MODEL), MEASURED["probabilistic"], fmt, approved=True)
    message = str(info.value)
    assert "\n" not in message and cites in message
    assert message.startswith("chat-pair@3's baselines were measured with probabilistic draft sampling")
    assert message.endswith("validate it with --draft-sampling greedy")
    for measured in ("greedy", "not recorded"):
        plan_export(make_pair(SpecMethod.DRAFT_MODEL), MEASURED[measured], fmt, approved=True)

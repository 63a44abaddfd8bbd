"""DFlash and DSpark exports: vLLM gets `method: dflash|dspark` with the head as `model` and the
registered k, checked against vLLM 0.33's schema, never a lossy rejection method; SGLang gets
DFLASH / DSPARK with the block as its draft-token window, for the engine-native layout it reads;
llama.cpp gets draft-dflash for the engine-native DFlash layout (tests/engines/test_llamacpp_dflash.py
converts and serves it); TensorRT-LLM 1.2, TGI and what each cannot run refuse in one line naming
the source."""

from __future__ import annotations

import dataclasses
import json

import jsonschema
import pytest
from exportcase import BASELINES, check_command, fingerprint, make_pair, record_argv

from headfiles import write_block_drafter, write_target
from specreg.core.heads import read_head
from specreg.core.heads.fit import check_head_fits
from specreg.core.types import ModelRef
from specreg.errors import EngineRefusal
from specreg.registry.deploy.exports import engine_schema, render_export
from specreg.registry.store.entities import SpecConfig, SpecMethod


def block_pair(tmp_path, kind: str, layout: str, config_extra: dict | None = None, tensor_extra: dict | None = None):
    """An approved pair over a real target and head directory, its head bound as register binds it."""
    target = write_target(tmp_path / "target")
    head_dir = write_block_drafter(tmp_path / "head", kind=kind, layout=layout,
                                   layer_ids=[2, 4] if layout == "speculators" else [1, 3], verifier=str(target),
                                   config_extra=config_extra, tensor_extra=tensor_extra)
    head = read_head(head_dir, method=kind)
    fit = check_head_fits(head, target)
    description = {**{k: v for k, v in head.to_dict().items() if k != "path"},
                   "fit": {"aux_layer_ids": list(fit.aux_layer_ids)}}
    base = make_pair()
    identity = dataclasses.replace(base.target.fingerprint, architecture="LlamaForCausalLM")
    config = SpecConfig(SpecMethod(kind), head.block["draft_length"], head=description)
    return dataclasses.replace(base, target=ModelRef(str(target), str(target), None, identity),
                               draft=ModelRef(str(head_dir), str(head_dir), None, fingerprint("d")), config=config)


@pytest.mark.parametrize("kind, layout, k", [("dflash", "speculators", 3), ("dflash", "native", 3),
                                             ("dspark", "speculators", 4), ("dspark", "native", 4)])
def test_vllm_gets_the_block_method_the_head_and_k(tmp_path, kind, layout, k):
    pair = block_pair(tmp_path, kind, layout)
    files = dict(render_export(pair, BASELINES, "vllm", approved=True))
    speculative = json.loads(files["vllm-speculative-config.json"])
    jsonschema.validate(speculative, engine_schema("vllm")["speculative_config"])
    assert speculative["method"] == kind and speculative["num_speculative_tokens"] == k
    assert speculative["model"] == str(tmp_path / "head")
    assert "rejection_sample_method" not in speculative  # vLLM's default, "standard": lossless


def test_sglang_serves_the_native_layout_with_its_block_as_the_window(tmp_path):
    pair = block_pair(tmp_path, "dflash", "native")
    files = dict(render_export(pair, BASELINES, "sglang", approved=True))
    flag = check_command(record_argv(files["sglang-launch.sh"], tmp_path / "run"), engine_schema("sglang"))
    assert flag["--speculative-draft-model-path"] == str(tmp_path / "head")
    assert (flag["--speculative-algorithm"], flag["--speculative-num-steps"], flag["--speculative-eagle-topk"],
            flag["--speculative-num-draft-tokens"]) == ("DFLASH", "1", "1", "4")


@pytest.mark.parametrize("fmt, kind", [("vllm", "dflash"), ("vllm", "dspark"), ("sglang", "dflash"),
                                       ("sglang", "dspark")])
def test_the_written_files_read_back_as_registered(tmp_path, fmt, kind):
    """What the export checks before the lock binds it (read_back.check): SGLang's DFLASH / DSPARK
    read as the registered method, k as the verify window less the root (SGLang forces one step for a
    block, so --speculative-num-steps 1 is no draft length)."""
    from specreg.registry.deploy import read_back as rb
    from specreg.registry.deploy.engines import sglang, vllm
    from specreg.registry.deploy.exports import plan_export

    pair = block_pair(tmp_path, kind, "native", config_extra={"markov_head_type": "vanilla"} if kind == "dspark" else None)
    files = dict(render_export(pair, BASELINES, fmt, approved=True))
    plan = plan_export(pair, BASELINES, fmt, approved=True)
    read = {"vllm": vllm, "sglang": sglang}[fmt].read_back(plan, files)
    assert {(item.field, item.value) for item in read if item.field in ("method", "k")} == \
        {("method", kind), ("k", pair.config.num_speculative_tokens)}
    rb.check(plan, read)


@pytest.mark.parametrize("kind", ["dflash", "dspark"])
def test_vllm_refuses_a_head_with_d2t_over_the_targets_whole_vocabulary(tmp_path, kind):
    """vLLM 0.33's DFlash and DSpark models build draft_id_to_target_id only for a smaller draft
    vocabulary, and their loaders rename d2t to it: with the whole vocabulary the load raises (the
    CPU vLLM died so on a head that carried one: "There is no module or parameter named
    'draft_id_to_target_id' in DFlashQwen3ForCausalLM")."""
    import numpy as np

    pair = block_pair(tmp_path, kind, "speculators", tensor_extra={"d2t": np.zeros(40, np.int64)})
    assert pair.config.head["has_vocab_map"] is True
    with pytest.raises(EngineRefusal) as caught:
        render_export(pair, BASELINES, "vllm", approved=True)
    assert "the head carries a d2t tensor while its draft vocabulary is the target's (40 ids)" in str(caught.value)
    assert "qwen3_dflash.py:769-775" in str(caught.value) and "\n" not in str(caught.value)


def test_sglang_refuses_a_dspark_head_that_names_no_markov_head_type(tmp_path):
    """Registration (as vLLM) reads a missing markov_head_type as 'vanilla'; SGLang's DSpark parser
    raises without one (tests/engines/test_sglang_exports.py runs it), so the export refuses it."""
    pair = block_pair(tmp_path, "dspark", "native")
    assert pair.config.head["block"]["markov_head_type"] == "vanilla"
    with pytest.raises(EngineRefusal) as caught:
        render_export(pair, BASELINES, "sglang", approved=True)
    assert "the head's config names no markov_head_type" in str(caught.value)
    assert "dspark_config.py:253-268" in str(caught.value) and "\n" not in str(caught.value)
    named = block_pair(tmp_path / "named", "dspark", "native", config_extra={"markov_head_type": "vanilla"})
    assert dict(render_export(named, BASELINES, "sglang", approved=True))["sglang-launch.sh"]


REFUSED = {
    ("sglang", "speculators"): "SGLang 0.5.23 reads a block drafter's config through transformers (the speculators "
                               "layout has no model_type: get_config raises)",
    ("trtllm", "native"): "TensorRT-LLM 1.2 has no block drafter: its speculative_config decoding_type is one of MTP",
    ("tgi", "native"): "TGI 3.3's --speculate does Medusa (from a combined repository) or n-gram only",
    ("llamacpp", "speculators"): "llama.cpp's converter takes the engine-native DFlashDraftModel layout only "
                                 "(conversion/qwen.py:664), not speculators' DFlashSpeculator",
}


@pytest.mark.parametrize("fmt, layout", sorted(REFUSED))
def test_engines_that_do_not_serve_it_as_validated_refuse_in_one_line(tmp_path, fmt, layout):
    pair = block_pair(tmp_path, "dflash", layout)
    with pytest.raises(EngineRefusal) as caught:
        render_export(pair, BASELINES, fmt, approved=True)
    assert "is a dflash pair and cannot be exported to" in str(caught.value)
    assert REFUSED[(fmt, layout)] in str(caught.value) and "\n" not in str(caught.value)


def test_llamacpp_drafts_the_block_of_the_registered_k(tmp_path):
    pair = block_pair(tmp_path, "dflash", "native")
    script = dict(render_export(pair, BASELINES, "llamacpp", approved=True))["llama-server.sh"]
    assert "--spec-type draft-dflash" in script
    # llama-server's block is --spec-draft-n-max + 1 tokens (common/speculative.cpp:1205): the head's
    assert "--spec-draft-n-max 3 " in script
    assert "(the head's block_size 4) from the target's layer inputs\n# 2, 4 (dflash.target_layers in its GGUF)" in script
    dspark = block_pair(tmp_path / "dspark", "dspark", "native")
    with pytest.raises(EngineRefusal, match=r"previous slot's argmax, not on the token it drafted \(src/models/dflash"):
        render_export(dspark, BASELINES, "llamacpp", approved=True)

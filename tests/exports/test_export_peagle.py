"""P-EAGLE exports: vLLM 0.33 gets `method: eagle3` with `parallel_drafting: true`, the head as
`model` and the registered k (checked against vLLM's schema here, and run through its own config
code in tests/engines/test_engine_exports.py), and reads back as the registered peagle pair; SGLang
0.5.23, TensorRT-LLM 1.2, TGI 3.3 and llama.cpp, which draft an EAGLE-3 head one token a forward or
not at all, refuse in one line naming their source."""

from __future__ import annotations

import dataclasses
import json

import jsonschema
import pytest
from exportcase import BASELINES, fingerprint, make_pair

from headfiles import write_peagle, write_target
from specreg.core.heads import read_head
from specreg.core.heads.fit import check_head_fits
from specreg.core.types import ModelRef
from specreg.errors import EngineRefusal, ReadBackError
from specreg.registry.deploy.exports import engine_schema, render_export
from specreg.registry.store.entities import SpecConfig, SpecMethod


def peagle_pair(tmp_path, k: int = 5):
    """An approved pair over a real target and P-EAGLE head directory, bound as register binds it."""
    target = write_target(tmp_path / "target")
    head_dir = write_peagle(tmp_path / "head", verifier=str(target))
    head = read_head(head_dir, method="peagle")
    fit = check_head_fits(head, target)
    description = {**{key: value for key, value in head.to_dict().items() if key != "path"},
                   "fit": {"aux_layer_ids": list(fit.aux_layer_ids)}}
    base = make_pair()
    identity = dataclasses.replace(base.target.fingerprint, architecture="LlamaForCausalLM")
    return dataclasses.replace(base, target=ModelRef(str(target), str(target), None, identity),
                               draft=ModelRef(str(head_dir), str(head_dir), None, fingerprint("d")),
                               config=SpecConfig(SpecMethod.PEAGLE, k, head=description))


def test_vllm_gets_eagle3_with_parallel_drafting_the_head_and_k(tmp_path):
    pair = peagle_pair(tmp_path)
    files = dict(render_export(pair, BASELINES, "vllm", approved=True))
    speculative = json.loads(files["vllm-speculative-config.json"])
    jsonschema.validate(speculative, engine_schema("vllm")["speculative_config"])
    assert speculative == {"method": "eagle3", "parallel_drafting": True, "num_speculative_tokens": 5,
                           "model": str(tmp_path / "head"), "draft_tensor_parallel_size": 1,
                           "draft_sample_method": "greedy"}
    assert json.dumps(speculative) in files["vllm-serve.sh"]


def test_the_vllm_files_read_back_as_the_registered_peagle_pair(tmp_path):
    """eagle3 with parallel_drafting reads back as peagle; without the key vLLM would draft the head
    one token a forward, and the export is refused (read_back.check)."""
    from specreg.registry.deploy import read_back as rb
    from specreg.registry.deploy.engines import vllm
    from specreg.registry.deploy.exports import plan_export

    pair = peagle_pair(tmp_path)
    files = dict(render_export(pair, BASELINES, "vllm", approved=True))
    plan = plan_export(pair, BASELINES, "vllm", approved=True)
    read = vllm.read_back(plan, files)
    assert [(item.field, item.value) for item in read if item.field in ("method", "k", "aux_layers")] == [
        ("method", "peagle"), ("k", 5), ("aux_layers", [1, 3, 4]), ("aux_layers", [1, 3, 4])] * 2  # the script, the json
    rb.check(plan, read)
    chained = dict(json.loads(files["vllm-speculative-config.json"]), parallel_drafting=False)
    with pytest.raises(ReadBackError, match=r"vllm-speculative-config\.json method reads back 'eagle3', registered "
                                            r"'peagle'"):
        rb.check(plan, vllm.speculative_values(plan, chained, "vllm-speculative-config.json"))


REFUSED = {
    "sglang": "SGLang 0.5.23 has no parallel drafting of an EAGLE-3 head: its EAGLE3 worker runs one draft forward "
              "per step, each fed the previous step's tokens (sglang/srt/speculative/eagle_worker_v2.py:808-830",
    "trtllm": "TensorRT-LLM 1.2 has no parallel drafting of an EAGLE-3 head: its speculative_config decoding_type is "
              "one of MTP, Medusa, Eagle",
    "tgi": "TGI 3.3's --speculate does Medusa (from a combined repository) or n-gram only",
    "llamacpp": "llama-server has no parallel drafting of an EAGLE-3 head: its --spec-type values are none, "
                "draft-simple, draft-eagle3, draft-mtp, draft-dflash, draft-dspark and ngram-* "
                "(common/speculative.cpp:33-45), and draft-eagle3 decodes one token a head forward",
}


@pytest.mark.parametrize("fmt", sorted(REFUSED))
def test_engines_that_do_not_serve_it_as_validated_refuse_in_one_line(tmp_path, fmt):
    with pytest.raises(EngineRefusal) as caught:
        render_export(peagle_pair(tmp_path), BASELINES, fmt, approved=True)
    assert "is a peagle pair and cannot be exported to" in str(caught.value)
    assert REFUSED[fmt] in str(caught.value) and "\n" not in str(caught.value)

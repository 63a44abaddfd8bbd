"""P-EAGLE heads (speculators' `peagle`) read without torch (specreg.core.heads.peagle_checkpoint):
the EAGLE-3 fields, the mask token and mask_hidden, the variant vLLM 0.33 builds, and the heads it
could not load refused in one line naming the file and field."""

from __future__ import annotations

import json

import numpy as np
import pytest

from specreg.core.heads import head_in_place_of_a_model, read_head
from specreg.core.heads.eagle3_variants import layers_fed, read_eagle3_variant
from specreg.core.heads.fit import check_head_fits
from specreg.core.heads.spec import HeadSpec
from specreg.errors import ModelReferenceError

from headfiles import HIDDEN, VOCAB, write_eagle3, write_peagle, write_target


def edit_config(directory, change) -> None:
    path = directory / "config.json"
    config = json.loads(path.read_text())
    change(config)
    path.write_text(json.dumps(config))


def test_a_peagle_head_is_read_as_an_eagle3_head_with_its_mask(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    target = write_target(tmp_path / "models" / "target")
    directory = write_peagle(tmp_path / "head")
    head = read_head(directory)
    assert (head.method, head.layout, head.parallel) == ("peagle", "speculators", {"mask_token_id": VOCAB - 1})
    assert (head.aux_layer_ids, head.target_vocab_size, head.speculative_tokens) == ((1, 3, 4), VOCAB, 3)
    assert head.tensor("mask_hidden").shape == (1, 1, 3 * HIDDEN)
    assert head.notes == ()  # vLLM reads an absent norm_before_residual as false for peagle, as speculators does
    assert read_head(directory, method="peagle") == head
    assert HeadSpec.from_dict(json.loads(json.dumps(head.to_dict()))) == head
    # an EAGLE-3 head's binding has no parallel entry: it hashes as before P-EAGLE was read
    assert "parallel" not in read_head(write_eagle3(tmp_path / "eagle3")).to_dict()
    fit = check_head_fits(head, target, target_reference="models/target")
    assert fit.aux_layer_ids == (1, 3, 4) and fit.verifier_matched
    assert fit.layers_fed["vllm"] == [1, 3, 4]
    with pytest.raises(ModelReferenceError, match=r"head: holds peagle head\(s\) \(speculators layout\), not eagle3"):
        read_head(directory, method="eagle3")
    assert head_in_place_of_a_model(directory) == (
        "a speculators 'peagle' head (speculators_model_type; architectures ['PEagleSpeculator'])", "peagle")
    # vLLM views any shape of mask_hidden's size (llama_eagle3.py:440)
    assert read_head(write_peagle(tmp_path / "flat", mask_hidden_shape=(1, 3 * HIDDEN))).method == "peagle"


def test_the_variant_is_read_as_vllms_update_peagle_reads_it(tmp_path):
    directory = write_peagle(tmp_path / "head", config_extra={"norm_output": True, "fc_norm": True,
                                                              "norm_before_fc": True})
    edit_config(directory, lambda c: c.pop("norm_before_residual"))
    variant = read_eagle3_variant(directory)
    # algos.py:53-86: architecture Peagle*, norm_before_residual absent = false, only norm_before_fc copied
    assert (variant.architecture, variant.layer_kind) == ("PeagleLlamaForCausalLM", "llama")
    assert (variant.norm_before_residual, variant.norm_before_fc, variant.fc_norm, variant.norm_output) == (
        False, True, False, False)
    assert layers_fed(variant, 5)["trained_on"] == [1, 3, 4]
    edit_config(directory, lambda c: c["transformer_layer_config"].update(model_type="qwen3"))
    assert read_eagle3_variant(directory).architecture == "PeagleQwen3ForCausalLM"
    edit_config(directory, lambda c: c["transformer_layer_config"].update(model_type="mistral"))
    with pytest.raises(ModelReferenceError, match="serves speculators peagle heads with llama or qwen3 layers only"):
        read_eagle3_variant(directory)


REFUSED = {
    "no mask token": (dict(mask_token_id=None), r"config\.json: mask_token_id is missing: vLLM 0\.33 reads the token "
                                                r"of the parallel-drafting slots from it .*algos\.py:83"),
    "mask token outside the vocabulary": (dict(config_extra={"mask_token_id": VOCAB}),
                                          rf"config\.json: mask_token_id {VOCAB} is not a token id of the "
                                          rf"{VOCAB}-token vocabulary the head reads"),
    "mask token not an integer": (dict(config_extra={"mask_token_id": True}), r"mask_token_id True is not a token id"),
    "no mask_hidden": (dict(tensor_extra={"mask_hidden": None}), r"no mask_hidden tensor: vLLM 0\.33 raises "
                                                                 r"\"mask_hidden not found in weights\""),
    "mask_hidden of another width": (dict(mask_hidden_shape=(1, 1, 2 * HIDDEN)),
                                     r"tensor mask_hidden has shape \[1, 1, 32\], expected 48 values \(3 aux states of "
                                     r"width 16\): vLLM 0\.33 copies it into a \[1, 48\] buffer"),
    "fc_norm weights vLLM builds no module for": (
        dict(config_extra={"fc_norm": True}, tensor_extra={"fc_norm.0.weight": np.ones(HIDDEN, np.float32)}),
        r"the head carries fc_norm\.\* weights, but vLLM 0\.33 reads no fc_norm for a peagle head .*utils\.py:442-448"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_what_vllm_could_not_load_is_refused_in_one_line(tmp_path, case):
    options, message = REFUSED[case]
    with pytest.raises(ModelReferenceError, match=message) as caught:
        read_head(write_peagle(tmp_path / "head", **options))
    assert "\n" not in str(caught.value)

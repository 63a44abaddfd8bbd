"""Block drafters (DFlash, DSpark) read in each layout and checked against a target
(specreg.core.heads.dflash_checkpoint): the target layers in each project's numbering, block size
and draft length, mask token, and the variants refused in one line."""

from __future__ import annotations

import json

import pytest

from specreg.core.heads import head_in_place_of_a_model, read_head
from specreg.core.heads.dflash_checkpoint import block_draft_length
from specreg.core.heads.fit import check_head_fits
from specreg.core.heads.spec import HeadSpec
from specreg.errors import HeadMismatchError, ModelReferenceError

from headfiles import LAYERS, VOCAB, write_block_drafter, write_target


@pytest.fixture
def target(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return write_target(tmp_path / "models" / "target")


def edit_config(directory, change):
    path = directory / "config.json"
    config = json.loads(path.read_text())
    change(config)
    path.write_text(json.dumps(config))


@pytest.mark.parametrize("kind, layout, declared, expected_ids, draft_length", [
    # speculators: aux_hidden_state_layer_ids are the states entering the layers (vLLM's numbering)
    ("dflash", "speculators", [2, 4], (2, 4), 3),
    ("dspark", "speculators", [2, 4], (2, 4), 4),  # sample_from_anchor true: every slot drafts
    # engine-native: target_layer_ids number a layer by its output, so the state entering layer id + 1
    ("dflash", "native", [1, 3], (2, 4), 3),
    ("dspark", "native", [1, 3], (2, 4), 4),  # vLLM's DSpark speculator: sample_from_anchor true when absent
])
def test_each_layout_is_read_in_one_numbering(tmp_path, target, kind, layout, declared, expected_ids, draft_length):
    head = read_head(write_block_drafter(tmp_path / "head", kind=kind, layout=layout, layer_ids=declared),
                     method=kind)
    assert (head.method, head.aux_layer_ids) == (kind, expected_ids)
    assert head.block["declared_layer_ids"] == declared and head.block["block_size"] == 4
    assert head.block["draft_length"] == draft_length and head.block["mask_token_id"] == 39
    fit = check_head_fits(head, target)
    assert fit.aux_layer_ids == expected_ids
    layers_note = next(note for note in fit.notes if note.startswith("target layers:"))
    assert layers_note.startswith("target layers: the head reads the outputs of target layers [1, 3] (declared "
                                  f"{'aux_hidden_state_layer_ids' if layout == 'speculators' else 'target_layer_ids'} "
                                  f"{declared}")
    assert "vLLM eagle_aux_hidden_state_layer_ids [2, 4] and llama.cpp dflash.target_layers [2, 4]" in layers_note
    assert head_in_place_of_a_model(tmp_path / "head")[1] == kind
    # what the binding records reads back as it was read
    assert HeadSpec.from_dict(head.to_dict()) == head


def test_other_heads_record_no_block(tmp_path):
    from headfiles import write_eagle3

    assert "block" not in read_head(write_eagle3(tmp_path / "eagle3")).to_dict()


def test_draft_length_defaults_to_the_block_and_a_disagreeing_k_is_refused(tmp_path):
    head = read_head(write_block_drafter(tmp_path / "head", block_size=8)).to_dict()
    assert block_draft_length(head, None) == 7 and block_draft_length(head, 7) == 7
    with pytest.raises(HeadMismatchError) as caught:
        block_draft_length(head, 4)
    assert str(caught.value) == ("num_speculative_tokens 4 disagrees with the head: block_size 8 drafts 7 tokens a "
                                 "step (block_size - 1: the anchor fills slot 0); omit -k or pass -k 7")


FIT_REFUSALS = {
    "mask token outside the vocabulary": (
        dict(mask_token_id=VOCAB), HeadMismatchError, f"mask_token_id {VOCAB} is outside the target's vocabulary "
                                                      f"(vocab_size {VOCAB})"),
    "native layer id past the last layer": (
        dict(layout="native", layer_ids=[1, LAYERS]), HeadMismatchError,
        f"target layers: target_layer_ids [1, {LAYERS}] (layer outputs) name layer(s) [{LAYERS}] outside the "
        f"target's {LAYERS} layers (valid: 0 .. {LAYERS - 1})"),
    "speculators id 0, the embeddings": (
        dict(layer_ids=[0, 4]), HeadMismatchError,
        f"target layers: aux_hidden_state_layer_ids [0, 4] (layer inputs) name layer(s) [0] outside the target's "
        f"{LAYERS} layers (valid: 1 .. {LAYERS})"),
    "hidden size": (dict(target_hidden=32), HeadMismatchError,
                    "hidden size: the head reads 32-wide target states (target_hidden_size) but the target's "
                    "hidden_size is 16"),
    "vocabulary": (dict(vocab=50, mask_token_id=3), HeadMismatchError,
                   "vocabulary size: the head maps into 50 ids (vocab_size) but the target's vocab_size is 40"),
}


@pytest.mark.parametrize("case", sorted(FIT_REFUSALS))
def test_a_head_that_does_not_fit_is_refused_in_one_line(tmp_path, target, case):
    options, error, message = FIT_REFUSALS[case]
    head = read_head(write_block_drafter(tmp_path / "head", **options))
    with pytest.raises(error) as caught:
        check_head_fits(head, target)
    assert str(caught.value) == message


READ_REFUSALS = {
    "gated Markov head": (
        dict(kind="dspark", config_extra={"markov_head_type": "gated"}),
        "markov_head_type 'gated' is a DSpark variant no engine specreg targets runs: vLLM 0.33 "
        "(model_executor/models/qwen3_dspark.py:48-93) and llama.cpp (conversion/qwen.py:898-899) run 'vanilla' "
        "only"),
    "ModelOpt's DSpark export": (
        dict(layout="native", config_extra={"dflash_config": {"mask_token_id": 39, "target_layer_ids": [1, 3],
                                                              "projector_type": "dspark"}}),
        "dflash_config.projector_type 'dspark' under architectures ['DFlashDraftModel'] is a variant specreg "
        "does not register: vLLM 0.33 serves method dspark only for Qwen3DSparkModel checkpoints "
        "(config/speculative.py:1543-1560) and runs DFlashDraftModel as plain DFlash (ModelOpt's DSpark export, "
        "hf_spec_export.py:523-545)"),
    "no mask token": (dict(mask_token_id=None), "mask_token_id is missing (the token that fills the block's masked "
                                                "slots; vLLM 0.33 requires it)"),
    "no layer ids": (dict(layer_ids=None), "aux_hidden_state_layer_ids is missing; vLLM 0.33 requires it "
                                           "(transformers_utils/configs/speculators/algos.py:114)"),
    "DSpark without sample_from_anchor": (
        dict(kind="dspark", config_extra={"sample_from_anchor": None}),
        "sample_from_anchor must be true or false, got None"),
    "no proposal method": (dict(config_extra={"speculators_config": {"verifier": {"name_or_path": "t"}}}),
                           "speculators_config.proposal_methods must be a non-empty list"),
    "fc for another layer count": (
        dict(layer_ids=[2, 3, 4]), "tensor fc.weight has shape [16, 32], expected [16, 48] (hidden_size x 3 "
                                   "target layers of width 16)"),
}


@pytest.mark.parametrize("case", sorted(READ_REFUSALS))
def test_an_unknown_variant_or_malformed_head_is_refused_in_one_line(tmp_path, case):
    options, message = READ_REFUSALS[case]
    head = write_block_drafter(tmp_path / "head", **options)
    if case == "fc for another layer count":
        edit_config(head, lambda c: c.update(aux_hidden_state_layer_ids=[2, 3, 4]))
        write_block_drafter(tmp_path / "two", layer_ids=[2, 4])
        (head / "model.safetensors").write_bytes((tmp_path / "two" / "model.safetensors").read_bytes())
    if case == "DSpark without sample_from_anchor":
        edit_config(head, lambda c: c.pop("sample_from_anchor"))
        message = ("sample_from_anchor is missing: speculators reads true for dspark (models/dspark/config.py), "
                   "vLLM 0.33 false (speculators/algos.py:188), so the engines would draft different tokens; state it")
    with pytest.raises(ModelReferenceError) as caught:
        read_head(head)
    assert str(caught.value).split(": ", 1)[1] == message
    assert "\n" not in str(caught.value)


def test_the_last_layers_output_registers_with_a_warning(tmp_path, target):
    head = read_head(write_block_drafter(tmp_path / "head", layout="native", layer_ids=[1, LAYERS - 1]))
    fit = check_head_fits(head, target)
    assert fit.aux_layer_ids == (2, LAYERS)
    assert fit.warnings == (f"target layers: [2, {LAYERS}] include {LAYERS}, the output of the target's last layer "
                            "before the final norm: engines read it, specreg's runtime does not, so validate's "
                            "runtime checks cannot run on this pair; its static checks do",)

"""Head recognition and fit checks (specreg.core.heads) on tiny head directories written here.

Each directory is real: config.json as the formats write it, safetensors files written with the
safetensors library (numpy arrays), tokenizer.json files written by hand or trained with the
`tokenizers` library.
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from specreg.core.heads import read_head
from specreg.core.heads.eagle3_checkpoint import default_aux_layer_ids
from specreg.core.heads.fit import check_head_fits
from specreg.core.heads.mtp_checkpoint import read_mtp
from specreg.core.heads.spec import HeadSpec
from specreg.core.heads.vocabulary import read_vocab_map, tokenizer_token_strings
from specreg.errors import HeadMismatchError, ModelReferenceError, UsageError

from headfiles import (DRAFT_IDS, DRAFT_VOCAB, HIDDEN, VOCAB, token_vocab, vocab_maps, write_eagle3, write_medusa,
                       write_target, write_tokenizer)


@pytest.fixture
def pair(tmp_path, monkeypatch):
    """A target at models/target (relative to the working directory) and a head that fits it."""
    monkeypatch.chdir(tmp_path)
    target = write_target(tmp_path / "models" / "target")
    head = write_eagle3(tmp_path / "head")
    return target, head


# --- recognition --------------------------------------------------------------------------

def test_speculators_eagle3_head_is_read_with_every_field(pair):
    target, head_dir = pair
    head = read_head(head_dir)
    assert (head.method, head.layout, head.path) == ("eagle3", "speculators", str(head_dir.resolve()))
    assert (head.hidden_size, head.target_hidden_size) == (16, 16)
    assert (head.draft_vocab_size, head.target_vocab_size) == (24, 40)
    assert head.aux_layer_ids == (1, 3, 4)
    assert (head.num_heads, head.num_layers, head.speculative_tokens) == (1, 1, 3)
    assert head.verifier_name_or_path == "models/target"
    assert head.verifier_architectures == ("LlamaForCausalLM",)
    assert head.verifier_fingerprint == {}
    assert (head.has_own_embeddings, head.has_vocab_map, head.layer_type) == (False, True, "llama")
    assert [t.name for t in head.tensors] == ["d2t", "fc.weight", "layers.0.hidden_norm.weight",
                                             "layers.0.self_attn.q_proj.weight", "lm_head.weight", "norm.weight",
                                             "t2d"]
    assert head.tensor("fc.weight").shape == (16, 48) and head.tensor("d2t").dtype == "I64"
    assert head.tensor("t2d").dtype == "BOOL" and head.weight_files == ("model.safetensors",)
    assert read_head(head_dir, method="eagle3") == head
    assert head.notes == ()
    edit_config(head_dir, lambda c: c.pop("norm_before_residual"))
    assert read_head(head_dir).notes == ("norm_before_residual absent: vLLM reads true, speculators false",)
    assert HeadSpec.from_dict(json.loads(json.dumps(head.to_dict()))) == head


def test_vocab_map_is_read_from_the_safetensors_bytes(pair):
    vocab_map = read_vocab_map(read_head(pair[1]))
    assert vocab_map.draft_to_target == tuple(DRAFT_IDS)
    assert (vocab_map.t2d_length, vocab_map.t2d_marked) == (40, tuple(DRAFT_IDS))


def test_original_eagle3_checkpoint_is_read(tmp_path):
    """SafeAILab/EAGLE layout: a LlamaConfig with draft_vocab_size, midlayer.* weights, ids in eagle_config."""
    directory = tmp_path / "eagle3-original"
    directory.mkdir()
    d2t, t2d = vocab_maps()
    save_file({"midlayer.self_attn.q_proj.weight": np.zeros((16, 32), np.float16),
               "fc.weight": np.zeros((16, 32), np.float16), "norm.weight": np.ones(16, np.float16),
               "lm_head.weight": np.zeros((24, 16), np.float16), "embed_tokens.weight": np.zeros((40, 16), np.float16),
               "d2t": d2t, "t2d": t2d}, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": 16, "vocab_size": 40,
        "num_hidden_layers": 1, "draft_vocab_size": 24, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 5]}}))
    head = read_head(directory)
    assert (head.method, head.layout, head.aux_layer_ids) == ("eagle3", "eagle", (0, 5))
    assert (head.draft_vocab_size, head.target_vocab_size, head.has_own_embeddings) == (24, 40, True)
    assert head.verifier_name_or_path is None
    target = write_target(tmp_path / "target")
    fit = check_head_fits(head, target)
    assert fit.aux_layer_ids == (0, 5) and not fit.verifier_matched
    assert "the head declares no verifier" in fit.notes
    assert "draft token strings not compared: the head ships no tokenizer.json" in fit.notes


def test_eagle_checkpoint_is_read(tmp_path):
    directory = tmp_path / "eagle"
    directory.mkdir()
    save_file({"fc.weight": np.zeros((16, 32), np.float32), "layers.0.mlp.up_proj.weight": np.zeros((32, 16),
               np.float32)}, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 16,
                                                       "vocab_size": 40, "num_hidden_layers": 1}))
    head = read_head(directory, method="eagle")
    assert (head.method, head.hidden_size, head.draft_vocab_size, head.num_layers) == ("eagle", 16, 40, 1)
    check_head_fits(head, write_target(tmp_path / "target"))


def test_an_eagle3_head_declared_as_eagle_is_refused(tmp_path):
    # an EAGLE-3 fc (three target states) under an EAGLE config: an engine choosing the method from
    # the config serves it as EAGLE (SGLang: acceptance length exactly 1.0, no warning)
    directory = tmp_path / "eagle3-as-eagle"
    directory.mkdir()
    save_file({"fc.weight": np.zeros((16, 48), np.float32), "layers.0.mlp.up_proj.weight": np.zeros((32, 16),
               np.float32)}, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps({"architectures": ["EagleLlamaForCausalLM"], "hidden_size": 16,
                                                       "vocab_size": 40, "num_hidden_layers": 1}))
    for method in (None, "eagle", "eagle3"):
        with pytest.raises(ModelReferenceError) as raised:
            read_head(directory, method=method)
        message = str(raised.value)
        assert "declares an EAGLE (1/2) head (architectures ['EagleLlamaForCausalLM']" in message
        assert "fc.weight [16, 48] reads 3 target states: an EAGLE-3 head, which engines would serve as EAGLE" in message
        assert "\n" not in message


@pytest.mark.parametrize("prefix", ["", "medusa_head."])
def test_medusa_heads_are_read(tmp_path, prefix):
    directory = write_medusa(tmp_path / "medusa", heads=3, layers=2, prefix=prefix)
    head = read_head(directory)
    assert (head.method, head.layout, head.num_heads, head.num_layers) == ("medusa", "medusa", 3, 2)
    assert (head.hidden_size, head.draft_vocab_size, head.target_vocab_size) == (16, 40, 40)
    assert head.verifier_name_or_path == "models/target" and head.weight_files == ("medusa_lm_head.safetensors",)
    assert len(head.tensors) == 3 * (2 * 2 + 1)


def test_medusa_num_layers_defaults_to_one(tmp_path):
    directory = write_medusa(tmp_path / "medusa", heads=2, layers=1)
    config = json.loads((directory / "config.json").read_text())
    del config["medusa_num_layers"]
    (directory / "config.json").write_text(json.dumps(config))
    head = read_head(directory)
    assert head.num_layers == 1 and head.notes == ("medusa_num_layers absent: 1 (MedusaConfig's default)",)


MTP_CASES = {
    # family: (config fields, MTP tensor names for 6 base layers and 1 MTP layer, one tensor that is not MTP)
    "deepseek": ({"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
                  "num_nextn_predict_layers": 1},
                 ["model.layers.6.eh_proj.weight", "model.layers.6.enorm.weight", "model.layers.6.hnorm.weight",
                  "model.layers.6.shared_head.norm.weight", "model.layers.6.self_attn.q_proj.weight"]),
    "mimo": ({"architectures": ["MiMoForCausalLM"], "model_type": "mimo", "num_nextn_predict_layers": 1},
             ["model.mtp_layers.0.hidden_layernorm.weight", "model.mtp_layers.0.input_proj.weight",
              "model.mtp_layers.0.token_layernorm.weight"]),
    "qwen3_next": ({"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next"},
                   ["mtp.fc.weight", "mtp.layers.0.mlp.gate.weight", "mtp.norm.weight",
                    "mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight"]),
    "qwen3_5": ({"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
                 "text_config": {"mtp_num_hidden_layers": 1}},
                ["mtp.fc.weight", "mtp.layers.0.self_attn.q_proj.weight", "mtp.norm.weight",
                 "mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight"]),
    "generic": ({"num_nextn_predict_layers": 1},  # a Llama target trained with a DeepSeek-style MTP layer
                ["model.layers.6.eh_proj.weight", "model.layers.6.enorm.weight", "model.layers.6.hnorm.weight",
                 "model.layers.6.mlp.up_proj.weight"]),
}
MTP_PROJECTIONS = ("eh_proj.weight", "input_proj.weight", "mtp.fc.weight")  # [H, 2H]; the rest sized 4 here


def mtp_tensors(names) -> dict[str, np.ndarray]:
    return {name: np.zeros((HIDDEN, 2 * HIDDEN) if name.endswith(MTP_PROJECTIONS) else 4, np.float32)
            for name in names}


@pytest.mark.parametrize("family", sorted(MTP_CASES))
def test_mtp_layers_inside_the_target_are_read(tmp_path, family):
    config, names = MTP_CASES[family]
    target = write_target(tmp_path / "target", config_extra=config, extra_tensors=mtp_tensors(names))
    head = read_head(target, method="mtp")
    assert (head.method, head.layout) == ("mtp", f"mtp:{'deepseek' if family == 'generic' else family}")
    assert [t.name for t in head.tensors] == sorted(names)  # not model.layers.0-5, embed or lm_head
    assert (head.num_heads, head.hidden_size, head.draft_vocab_size, head.path) == (1, 16, 40, str(target.resolve()))
    assert head.notes == (("num_nextn_predict_layers absent: 1 (vLLM's default for qwen3_next)",)
                          if family == "qwen3_next" else ())
    assert check_head_fits(head, target).verifier_matched


def test_mtp_declared_without_its_tensors_is_refused(tmp_path):
    target = write_target(tmp_path / "target", config_extra={"model_type": "deepseek_v3",
                                                             "num_nextn_predict_layers": 2},
                          extra_tensors=mtp_tensors(MTP_CASES["deepseek"][1]))
    with pytest.raises(ModelReferenceError, match=r"num_nextn_predict_layers = 2 but the weights hold no tensor "
                                                  r"under model\.layers\.7\."):
        read_mtp(target)


def test_target_without_mtp_is_refused(tmp_path):
    target = write_target(tmp_path / "target")
    with pytest.raises(ModelReferenceError, match="declares no MTP layers"):
        read_head(target, method="mtp")
    zero = write_target(tmp_path / "zero", config_extra={"model_type": "deepseek_v3", "num_nextn_predict_layers": 0})
    with pytest.raises(ModelReferenceError, match="num_nextn_predict_layers is 0"):
        read_mtp(zero)


@pytest.mark.parametrize("family, dropped", [("deepseek", "model.layers.6.eh_proj.weight"),
                                             ("generic", "model.layers.6.hnorm.weight"),
                                             ("mimo", "model.mtp_layers.0.input_proj.weight"),
                                             ("qwen3_next", "mtp.pre_fc_norm_hidden.weight")])
def test_an_mtp_layer_without_its_projection_is_refused_as_vllm_does(tmp_path, family, dropped):
    """vLLM 0.33 raises "Following weights were not initialized from checkpoint" for it: register
    must not accept what no engine loads."""
    config, names = MTP_CASES[family]
    target = write_target(tmp_path / "target", config_extra=config,
                          extra_tensors=mtp_tensors([name for name in names if name != dropped]))
    with pytest.raises(ModelReferenceError, match=f"has no {re.escape(dropped)}: vLLM 0.33 builds it .* "
                                                  "refuses a checkpoint without it"):
        read_head(target, method="mtp")


def test_an_mtp_projection_of_the_wrong_width_is_refused(tmp_path):
    config, names = MTP_CASES["deepseek"]
    tensors = mtp_tensors(names)
    tensors["model.layers.6.eh_proj.weight"] = np.zeros((HIDDEN, HIDDEN), np.float32)
    target = write_target(tmp_path / "target", config_extra=config, extra_tensors=tensors)
    with pytest.raises(ModelReferenceError, match=r"eh_proj.weight has shape \[16, 16\], expected \[16, 32\]"):
        read_mtp(target)


def test_mtp_of_another_target_does_not_fit(tmp_path):
    config, names = MTP_CASES["deepseek"]
    target = write_target(tmp_path / "target", config_extra=config,
                          extra_tensors=mtp_tensors(names))
    other = write_target(tmp_path / "other")
    with pytest.raises(HeadMismatchError, match="^MTP layers: read from .*target, but the target is .*other"):
        check_head_fits(read_mtp(target), other)


def test_a_head_of_another_kind_than_asked_is_refused(tmp_path):
    medusa = write_medusa(tmp_path / "medusa")
    with pytest.raises(ModelReferenceError, match=r"medusa: holds medusa head\(s\) \(medusa layout\), not eagle3"):
        read_head(medusa, method="eagle3")
    with pytest.raises(UsageError, match="unknown head method 'hydra'"):
        read_head(medusa, method="hydra")
    with pytest.raises(ModelReferenceError, match="not a head directory.*use method mtp"):
        read_head(write_target(tmp_path / "target"))


# --- the fit ------------------------------------------------------------------------------

def test_a_fitting_head_passes_every_check(pair):
    target, head_dir = pair
    strings = token_vocab()
    write_tokenizer(head_dir, strings)  # the head ships its verifier's tokenizer
    fit = check_head_fits(read_head(head_dir), target, target_reference="models/target")
    assert fit.aux_layer_ids == (1, 3, 4)
    assert fit.verifier_matched and fit.compared_token_strings == DRAFT_VOCAB and fit.notes == ()


def test_the_default_aux_layers_are_resolved_against_the_target(tmp_path):
    target = write_target(tmp_path / "target", layers=8)
    head = read_head(write_eagle3(tmp_path / "head", aux=None, verifier=str(target)))
    fit = check_head_fits(head, target)
    assert fit.aux_layer_ids == default_aux_layer_ids(8) == (2, 4, 5)
    assert "aux layer ids: the target's default [2, 4, 5] (the head names none)" in fit.notes


def test_wrong_hidden_size_is_named(tmp_path):
    target = write_target(tmp_path / "target", hidden=24)
    head = read_head(write_eagle3(tmp_path / "head", verifier=str(target)))
    with pytest.raises(HeadMismatchError, match=r"^hidden size: the head reads 16-wide target states \(hidden_size\) "
                                                r"but the target's hidden_size is 24$"):
        check_head_fits(head, target)


def test_target_hidden_size_is_what_must_fit(tmp_path):
    """A head of width 8 reading 16-wide states fits a 16-wide target when it has its own embeddings."""
    target = write_target(tmp_path / "target")
    embeddings = {"embed_tokens.weight": np.zeros((40, 8), np.float32)}
    head = read_head(write_eagle3(tmp_path / "head", hidden=8, target_hidden=16, verifier=str(target),
                                  tensor_extra=embeddings))
    assert (head.hidden_size, head.target_hidden_size, head.tensor("fc.weight").shape) == (8, 16, (8, 48))
    check_head_fits(head, target)
    shared = read_head(write_eagle3(tmp_path / "shared", hidden=8, target_hidden=16, verifier=str(target)))
    with pytest.raises(HeadMismatchError, match="^hidden size: the head has no embed_tokens of its own, so it shares "
                                                "the target's 16-wide embeddings, but its hidden_size is 8$"):
        check_head_fits(shared, target)
    wide = write_target(tmp_path / "wide", hidden=32)
    with pytest.raises(HeadMismatchError, match=r"the head reads 16-wide target states \(target_hidden_size\)"):
        check_head_fits(head, wide, allow_verifier_mismatch=True)  # declared for `target`, not `wide`


@pytest.mark.parametrize("aux, message", [
    ([2, 3, 7], r"eagle_aux_hidden_state_layer_ids \[2, 3, 7\] name layer\(s\) \[7\] outside the target's 6 layers"),
    ([-1, 3, 4], r"eagle_aux_hidden_state_layer_ids \[-1, 3, 4\] name layer\(s\) \[-1\]"),
])
def test_aux_layer_id_out_of_range_is_named(tmp_path, aux, message):
    target = write_target(tmp_path / "target")
    head = read_head(write_eagle3(tmp_path / "head", aux=aux, verifier=str(target)))
    with pytest.raises(HeadMismatchError, match="^aux layer ids: " + message):
        check_head_fits(head, target)


def test_the_last_layer_output_is_a_valid_aux_layer(tmp_path):
    target = write_target(tmp_path / "target")
    head = read_head(write_eagle3(tmp_path / "head", aux=[0, 3, 6], verifier=str(target)))
    fit = check_head_fits(head, target)
    assert fit.aux_layer_ids == (0, 3, 6)
    # vLLM reads it and so does specreg's runtime: nothing to warn about
    assert fit.warnings == ()


@pytest.mark.parametrize("layers, repeated", [(4, "[2, 2, 1] names layer 2"), (5, "[2, 2, 2] names layer 2"),
                                              (6, "[2, 3, 3] names layer 3")])
def test_default_aux_layers_that_repeat_a_layer_are_refused_as_vllm_cannot_run_them(tmp_path, layers, repeated):
    """vLLM 0.33 collects each default layer once and feeds fc fewer states than it was sized for
    (a shape error at its first forward): refused at registration with that reason."""
    target = write_target(tmp_path / "target", layers=layers)
    head = read_head(write_eagle3(tmp_path / "head", aux=None, verifier=str(target)))
    with pytest.raises(HeadMismatchError, match=r"^aux layer ids: the head names none, and the target's default "
                                                r"\(2, N // 2, N - 3\) = " + re.escape(repeated) + " twice on this "
                                                f"{layers}-layer target; vLLM 0.33 collects each layer once"):
        check_head_fits(head, target)
    assert check_head_fits(read_head(write_eagle3(tmp_path / "named", aux=[1, 2, 3], verifier=str(target))),
                           target).aux_layer_ids == (1, 2, 3)
    for deep_enough in (3, 7):  # (2, 1, 0) and (2, 3, 4): three layers, as fc expects
        other = write_target(tmp_path / f"target-{deep_enough}", layers=deep_enough)
        fit = check_head_fits(read_head(write_eagle3(tmp_path / f"head-{deep_enough}", aux=None,
                                                     verifier=str(other))), other)
        assert len(set(fit.aux_layer_ids)) == 3


def test_the_default_aux_layers_must_fit_a_shallow_target(tmp_path):
    target = write_target(tmp_path / "target", layers=2)
    head = read_head(write_eagle3(tmp_path / "head", aux=None, verifier=str(target)))
    with pytest.raises(HeadMismatchError, match=r"^aux layer ids: the default aux layer ids \[2, 1, -1\] name "
                                                r"layer\(s\) \[-1\] outside the target's 2 layers"):
        check_head_fits(head, target)


def test_vocabulary_size_is_named(tmp_path):
    target = write_target(tmp_path / "target", vocab=48)
    head = read_head(write_eagle3(tmp_path / "head", verifier=str(target)))
    with pytest.raises(HeadMismatchError, match=r"^vocabulary size: the head maps into 40 ids "
                                                r"\(transformer_layer_config.vocab_size\) but the target's vocab_size "
                                                r"is 48$"):
        check_head_fits(head, target)


def test_medusa_for_another_hidden_size_or_vocabulary_is_named(tmp_path):
    target = write_target(tmp_path / "target")
    with pytest.raises(HeadMismatchError, match="^hidden size: the head reads 32-wide"):
        check_head_fits(read_head(write_medusa(tmp_path / "wide", hidden=32, base=str(target))), target)
    with pytest.raises(HeadMismatchError, match=r"^vocabulary size: the head maps into 50 ids \(rows of each head's "
                                                r"output layer\)"):
        check_head_fits(read_head(write_medusa(tmp_path / "vocab", vocab=50, base=str(target))), target)
    fit = check_head_fits(read_head(write_medusa(tmp_path / "ok", base=str(target))), target)
    assert fit.verifier_matched and fit.notes == ("draft token strings not compared: the head ships no tokenizer.json",)


# --- the vocabulary map -------------------------------------------------------------------

def test_d2t_off_by_one_is_named(tmp_path):
    """Offsets shifted by one: the last draft id lands one past the target vocabulary."""
    target = write_target(tmp_path / "target")
    d2t, t2d = vocab_maps()
    head = read_head(write_eagle3(tmp_path / "head", d2t=d2t + 1, t2d=t2d, verifier=str(target)))
    with pytest.raises(HeadMismatchError, match=r"^vocabulary map: d2t maps 1 draft id\(s\) outside the target's 40 "
                                                r"ids \(draft id 23 -> 40\); target id = i \+ d2t\[i\]$"):
        check_head_fits(head, target)


def test_d2t_holding_target_ids_instead_of_offsets_is_named(tmp_path):
    target = write_target(tmp_path / "target")
    _, t2d = vocab_maps()
    absolute = np.array(DRAFT_IDS, np.int64)
    head = read_head(write_eagle3(tmp_path / "head", d2t=absolute, t2d=t2d, verifier=str(target)))
    outside = sum(1 for i, t in enumerate(DRAFT_IDS) if i + t >= VOCAB)
    with pytest.raises(HeadMismatchError, match=rf"^vocabulary map: d2t maps {outside} draft id\(s\) outside"):
        check_head_fits(head, target)


def test_non_injective_d2t_is_named(tmp_path):
    target = write_target(tmp_path / "target")
    ids = list(DRAFT_IDS)
    ids[5] = ids[4]
    d2t, t2d = vocab_maps(ids)
    head = read_head(write_eagle3(tmp_path / "head", d2t=d2t, t2d=t2d, verifier=str(target)))
    with pytest.raises(HeadMismatchError, match=rf"^vocabulary map: d2t is not one to one: draft ids 4 and 5 both map "
                                                rf"to target id {ids[4]}$"):
        check_head_fits(head, target)


def test_t2d_that_disagrees_with_d2t_is_named(tmp_path):
    target = write_target(tmp_path / "target")
    d2t, t2d = vocab_maps()
    t2d[DRAFT_IDS[0]], t2d[0] = False, True
    head = read_head(write_eagle3(tmp_path / "head", d2t=d2t, t2d=t2d, verifier=str(target)))
    with pytest.raises(HeadMismatchError, match=r"t2d does not mark the same set \(marked, not mapped: \[0\]; mapped, "
                                                r"not marked: \[3\]\)"):
        check_head_fits(head, target)


def test_t2d_for_another_vocabulary_is_named(tmp_path):
    target = write_target(tmp_path / "target", vocab=48)
    d2t, _ = vocab_maps()
    t2d = np.zeros(48, bool)
    t2d[DRAFT_IDS] = True
    head = read_head(write_eagle3(tmp_path / "head", vocab=48, d2t=d2t, t2d=t2d, verifier=str(target)))
    check_head_fits(head, target)  # the same map over a 48-id target fits
    narrow = write_target(tmp_path / "narrow", vocab=40)
    with pytest.raises(HeadMismatchError, match="^vocabulary size"):
        check_head_fits(head, narrow, allow_verifier_mismatch=True)  # declared for `target`, not `narrow`


def test_a_reduced_draft_vocabulary_without_d2t_is_named(tmp_path):
    target = write_target(tmp_path / "target")
    head = read_head(write_eagle3(tmp_path / "head", vocab_map=False, verifier=str(target)))
    with pytest.raises(HeadMismatchError, match="^vocabulary map: draft_vocab_size 24 differs from the target's "
                                                "vocab_size 40 but the head has no d2t tensor"):
        check_head_fits(head, target)


def test_a_full_draft_vocabulary_needs_no_map_but_refuses_a_permutation(tmp_path):
    target = write_target(tmp_path / "target")
    full = read_head(write_eagle3(tmp_path / "full", draft_vocab=40, vocab_map=False, verifier=str(target),
                                  strings=token_vocab()))
    assert check_head_fits(full, target).compared_token_strings == 40
    swapped = list(range(40))
    swapped[1], swapped[2] = 2, 1
    d2t, t2d = vocab_maps(swapped)
    permuted = read_head(write_eagle3(tmp_path / "permuted", draft_vocab=40, d2t=d2t, t2d=t2d, verifier=str(target)))
    with pytest.raises(HeadMismatchError, match="^vocabulary map: d2t permutes the ids but draft_vocab_size equals"):
        check_head_fits(permuted, target)


# --- draft token strings ------------------------------------------------------------------

def test_draft_token_strings_that_differ_are_named(tmp_path):
    target = write_target(tmp_path / "target")
    renamed = {DRAFT_IDS[7]: "other7", DRAFT_IDS[9]: "other9"}
    head = read_head(write_eagle3(tmp_path / "head", verifier=str(target), strings=token_vocab(renamed=renamed)))
    with pytest.raises(HeadMismatchError, match=rf"^draft vocabulary: draft id 7 maps to target id {DRAFT_IDS[7]}, "
                                                rf"spelled 'other7' by the head but 'tok{DRAFT_IDS[7]}' by the target "
                                                rf"\(2 of 24 draft ids differ\)$"):
        check_head_fits(head, target)
    # an id outside the draft vocabulary may differ: the head never emits it
    unmapped = next(i for i in range(1, VOCAB) if i not in DRAFT_IDS)
    head = read_head(write_eagle3(tmp_path / "head2", verifier=str(target),
                                  strings=token_vocab(renamed={unmapped: "elsewhere"})))
    assert check_head_fits(head, target).compared_token_strings == DRAFT_VOCAB


def test_token_strings_can_be_given_as_callables(pair):
    target, head_dir = pair
    head = read_head(head_dir)
    draft_strings = {draft_id: f"tok{target_id}" for draft_id, target_id in enumerate(DRAFT_IDS)}
    fit = check_head_fits(head, target, draft_token_strings=draft_strings.get,
                          target_token_strings=lambda i: f"tok{i}")
    assert fit.compared_token_strings == DRAFT_VOCAB
    draft_strings[3] = "tok0"
    with pytest.raises(HeadMismatchError, match=rf"^draft vocabulary: draft id 3 maps to target id {DRAFT_IDS[3]}, "
                                                rf"spelled 'tok0' by the head"):
        check_head_fits(head, target, draft_token_strings=draft_strings, target_token_strings=lambda i: f"tok{i}")


def train_tokenizer(directory: Path, corpus: list[str]) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    return directory / "tokenizer.json"


def test_token_strings_of_real_tokenizers(tmp_path):
    """tokenizer.json files written by the tokenizers library: our JSON reading equals
    Tokenizer.id_to_token, and a head trained with another tokenizer is caught at the first
    draft id whose merged token differs."""
    from tokenizers import Tokenizer

    corpus = ["the quick brown fox jumps over the lazy dog", "speculative decoding drafts tokens"] * 10
    target_json = train_tokenizer(tmp_path / "tok-target", corpus)
    head_json = train_tokenizer(tmp_path / "tok-head", ["hello world, a different corpus of text"] * 10)
    target_tok, head_tok = Tokenizer.from_file(str(target_json)), Tokenizer.from_file(str(head_json))
    vocab = target_tok.get_vocab_size()
    assert tokenizer_token_strings(target_json.parent) == {i: target_tok.id_to_token(i) for i in range(vocab)}

    target = write_target(tmp_path / "target", vocab=vocab)
    (target / "tokenizer.json").write_bytes(target_json.read_bytes())
    draft_ids = list(range(0, vocab, 3))
    d2t, t2d = vocab_maps(draft_ids, vocab)
    head_dir = write_eagle3(tmp_path / "head", vocab=vocab, draft_vocab=len(draft_ids), d2t=d2t, t2d=t2d,
                            verifier=str(target))
    (head_dir / "tokenizer.json").write_bytes(head_json.read_bytes())
    first = next(d for d, t in enumerate(draft_ids) if head_tok.id_to_token(t) != target_tok.id_to_token(t))
    with pytest.raises(HeadMismatchError, match=rf"^draft vocabulary: draft id {first} maps to target id "
                                                rf"{draft_ids[first]}, spelled"):
        check_head_fits(read_head(head_dir), target)
    (head_dir / "tokenizer.json").write_bytes(target_json.read_bytes())
    assert check_head_fits(read_head(head_dir), target).compared_token_strings == len(draft_ids)


# --- the declared verifier ----------------------------------------------------------------

def test_a_head_for_another_verifier_is_refused_unless_allowed(pair):
    target, _ = pair
    head = read_head(write_eagle3(Path("other-head"), verifier="meta-llama/Llama-3.1-8B-Instruct"))
    with pytest.raises(HeadMismatchError, match=r"^verifier: the head declares verifier "
                                                r"'meta-llama/Llama-3.1-8B-Instruct', the target is 'models/target' "
                                                r"\(--allow-verifier-mismatch registers it anyway"):
        check_head_fits(head, target, target_reference="models/target")
    fit = check_head_fits(head, target, target_reference="models/target", allow_verifier_mismatch=True)
    assert not fit.verifier_matched
    assert fit.notes[-1] == ("verifier mismatch allowed: the head declares verifier "
                             "'meta-llama/Llama-3.1-8B-Instruct', the target is 'models/target'")


def test_a_head_for_another_model_is_named_by_its_verifier_first(pair):
    target, _ = pair
    head = read_head(write_eagle3(Path("wide-head"), hidden=32, verifier="acme/big-model"))
    with pytest.raises(HeadMismatchError, match="^verifier: the head declares verifier 'acme/big-model'"):
        check_head_fits(head, target)
    with pytest.raises(HeadMismatchError, match="^hidden size: the head reads 32-wide target states"):
        check_head_fits(head, target, allow_verifier_mismatch=True)  # allowing it skips no other check


def test_the_verifier_name_matches_the_reference_path_or_recorded_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    target = write_target(tmp_path / "models" / "target", config_extra={"_name_or_path": "acme/tiny-chat"})
    for declared in ("models/target", str(target.resolve()), "acme/tiny-chat", "ACME/tiny-chat", "./models/target/"):
        head = read_head(write_eagle3(tmp_path / "head", verifier=declared))
        assert check_head_fits(head, target).verifier_matched, declared
    head = read_head(write_eagle3(tmp_path / "head", verifier="acme/tiny-chat-v2"))
    assert check_head_fits(head, target, target_reference="acme/tiny-chat-v2@0123abc").verifier_matched
    with pytest.raises(HeadMismatchError, match="^verifier: "):
        check_head_fits(head, target)


def test_the_verifier_in_the_hf_cache_matches_its_hub_id(tmp_path):
    snapshot = write_target(tmp_path / "hub" / "models--acme--tiny-chat" / "snapshots" / ("a" * 40))
    head = read_head(write_eagle3(tmp_path / "head", verifier="acme/tiny-chat"))
    assert check_head_fits(head, snapshot).verifier_matched


def test_verifier_architectures_must_meet(pair):
    target, _ = pair
    head = read_head(write_eagle3(Path("qwen-head"), architectures=["Qwen3ForCausalLM"]))
    with pytest.raises(HeadMismatchError, match=r"^verifier: the head declares verifier architectures "
                                                r"\['Qwen3ForCausalLM'\], the target is \['LlamaForCausalLM'\]"):
        check_head_fits(head, target)


def test_the_verifier_fingerprint_decides_over_the_name(pair):
    from specreg.core.fingerprint import fingerprint_model

    target, _ = pair
    fingerprint = fingerprint_model(target)
    recorded = {"weights_sha256": fingerprint.weights_sha256, "tokenizer_sha256": fingerprint.tokenizer_sha256}
    renamed = read_head(write_eagle3(Path("renamed"), verifier="somewhere/else", fingerprint=recorded))
    assert renamed.verifier_fingerprint == recorded
    assert check_head_fits(renamed, target, target_fingerprint=fingerprint).verifier_matched
    other = dict(recorded, weights_sha256="0" * 64)
    same_name = read_head(write_eagle3(Path("retrained"), fingerprint=other))
    with pytest.raises(HeadMismatchError, match=r"^verifier: the head records verifier weights_sha256 000000000000, "
                                                rf"the target's is {fingerprint.weights_sha256[:12]}"):
        check_head_fits(same_name, target, target_fingerprint=fingerprint)
    fit = check_head_fits(same_name, target)  # no target fingerprint given: the name decides, and it says so
    assert fit.verifier_matched
    assert "the head records its verifier's fingerprint; not compared (no target fingerprint given)" in fit.notes


# --- malformed input ----------------------------------------------------------------------

def edit_config(directory: Path, change) -> None:
    path = directory / "config.json"
    config = json.loads(path.read_text())
    change(config)
    path.write_text(json.dumps(config))


def layer(config):
    return config["transformer_layer_config"]


MALFORMED = {
    "hidden size as a string": (lambda c: layer(c).update(hidden_size="16"),
                                r"config\.json: transformer_layer_config\.hidden_size must be a positive integer, "
                                r"got '16'"),
    "negative vocabulary": (lambda c: layer(c).update(vocab_size=-40),
                            r"config\.json: transformer_layer_config\.vocab_size must be a positive integer, got -40"),
    "boolean draft vocabulary": (lambda c: c.update(draft_vocab_size=True),
                                 r"config\.json: draft_vocab_size must be a positive integer, got True"),
    "float layer ids": (lambda c: c.update(eagle_aux_hidden_state_layer_ids=[1.0, 3, 4]),
                        r"config\.json: eagle_aux_hidden_state_layer_ids must be a list of integers"),
    "repeated layer id": (lambda c: c.update(eagle_aux_hidden_state_layer_ids=[1, 3, 3]),
                          r"config\.json: eagle_aux_hidden_state_layer_ids names a layer twice"),
    "layer config not an object": (lambda c: c.update(transformer_layer_config=[16]),
                                   r"config\.json: transformer_layer_config must be a JSON object"),
    "no verifier name": (lambda c: c["speculators_config"]["verifier"].pop("name_or_path"),
                         r"config\.json: speculators_config\.verifier\.name_or_path is missing"),
    "verifier architectures not strings": (lambda c: c["speculators_config"]["verifier"].update(architectures="x"),
                                           r"speculators_config\.verifier\.architectures must be a list of strings"),
    "no proposal method": (lambda c: c["speculators_config"].update(proposal_methods=[]),
                           r"speculators_config\.proposal_methods must be a non-empty list"),
    "zero speculative tokens": (lambda c: c["speculators_config"]["proposal_methods"][0].update(speculative_tokens=0),
                                r"proposal_methods\[0\]\.speculative_tokens must be a positive integer, got 0"),
    "another speculators kind": (lambda c: c.update(speculators_model_type="hydra"),
                                 r"speculators_model_type 'hydra' is not a head kind specreg registers"),
    "fingerprint not a digest": (lambda c: c["speculators_config"]["verifier"].update(specreg={"weights_sha256": 5}),
                                 r"speculators_config\.verifier\.specreg\.weights_sha256 must be a sha256 hex digest"),
    "more aux ids than fc reads": (lambda c: c.update(eagle_aux_hidden_state_layer_ids=[1, 2, 3, 4]),
                                   r"tensor fc\.weight has shape \[16, 48\], expected \[16, 64\]: the config names "
                                   r"4 aux layer ids of width 16"),
    "lm_head rows against draft_vocab_size": (lambda c: c.update(draft_vocab_size=30),
                                              r"tensor lm_head\.weight has shape \[24, 16\], expected \[30, 16\]"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_head_config_names_file_and_field(tmp_path, case):
    change, message = MALFORMED[case]
    head = write_eagle3(tmp_path / "head")
    edit_config(head, change)
    with pytest.raises(ModelReferenceError, match=message) as caught:
        read_head(head)
    assert "\n" not in str(caught.value)


def test_nan_hidden_size_is_refused(tmp_path):
    head = write_eagle3(tmp_path / "head")
    path = head / "config.json"
    path.write_text(path.read_text().replace('"hidden_size": 16', '"hidden_size": NaN'))
    with pytest.raises(ModelReferenceError, match=r"transformer_layer_config\.hidden_size must be a positive integer, "
                                                  r"got nan"):
        read_head(head)


@pytest.mark.parametrize("content, message", [
    (None, r"head: no config\.json \(not a head directory\)"),
    (b"{not json", r"config\.json: not readable JSON \(JSONDecodeError"),
    (b"\xff\xfe\x00", r"config\.json: not readable JSON \(UnicodeDecodeError"),
    (b"[1, 2]", r"config\.json: expected a JSON object"),
    (b"[" * 100000 + b"]" * 100000, r"config\.json: not readable JSON \(nested too deeply\)"),
])
def test_unreadable_config_is_named(tmp_path, content, message):
    head = write_eagle3(tmp_path / "head")
    if content is None:
        (head / "config.json").unlink()
    else:
        (head / "config.json").write_bytes(content)
    with pytest.raises(ModelReferenceError, match=message):
        read_head(head)


@pytest.mark.parametrize("tensors, message", [
    ({"d2t": np.zeros(24, np.float32)}, r"tensor d2t is F32 \[24\], expected int64 \[24\]"),
    ({"d2t": np.zeros((2, 12), np.int64)}, r"tensor d2t is I64 \[2, 12\], expected int64 \[24\]"),
    ({"t2d": np.zeros(39, bool)}, r"tensor t2d is BOOL \[39\], expected bool \[40\]"),
    ({"fc.weight": None}, r"no fc\.weight tensor"),
    ({"lm_head.weight": None}, r"no lm_head\.weight tensor"),
    ({"embed_tokens.weight": np.zeros((40, 12), np.float32)},
     r"tensor embed_tokens\.weight has shape \[40, 12\], expected \[40, 16\]"),
])
def test_malformed_head_tensors_name_file_and_tensor(tmp_path, tensors, message):
    head = write_eagle3(tmp_path / "head", tensor_extra=tensors)
    with pytest.raises(ModelReferenceError, match=message):
        read_head(head)


def test_t2d_with_values_other_than_0_and_1_is_refused(tmp_path):
    target = write_target(tmp_path / "target")
    _, t2d = vocab_maps()
    head = read_head(write_eagle3(tmp_path / "head", t2d=t2d.astype(np.uint8) * 2, verifier=str(target)))
    with pytest.raises(ModelReferenceError, match="tensor t2d holds values other than 0 and 1"):
        check_head_fits(head, target)


def test_corrupt_or_pickled_weights_are_named(tmp_path):
    head = write_eagle3(tmp_path / "head")
    weights = head / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:-8])  # the file ends inside the last tensor
    with pytest.raises(ModelReferenceError, match=r"model\.safetensors: corrupt safetensors header"):
        read_head(head)
    nested = b"[" * 100000 + b"]" * 100000
    weights.write_bytes(struct.pack("<Q", len(nested)) + nested)
    with pytest.raises(ModelReferenceError, match=r"corrupt safetensors header \(JSON nested too deeply\)"):
        read_head(head)
    header = json.dumps({"d2t": {"dtype": "I64", "shape": ["24"], "data_offsets": [0, 192]}}).encode()
    weights.write_bytes(struct.pack("<Q", len(header)) + header + bytes(192))
    with pytest.raises(ModelReferenceError, match=r"tensor d2t: shape \[.24.\] is not a list of non-negative integers"):
        read_head(head)
    weights.unlink()
    (head / "medusa_lm_head.pt").write_bytes(b"\x80\x04")
    with pytest.raises(ModelReferenceError, match=r"weights are only pickle files \(medusa_lm_head\.pt\)"):
        read_head(head)


def test_malformed_medusa_and_target_configs_are_named(tmp_path):
    medusa = write_medusa(tmp_path / "medusa", heads=2)
    edit_config(medusa, lambda c: c.update(medusa_num_heads=3))
    with pytest.raises(ModelReferenceError, match=r"no tensor 2\.0\.linear\.weight \(medusa_num_heads = 3"):
        read_head(medusa)
    edit_config(medusa, lambda c: c.update(medusa_num_heads=2, medusa_num_layers=-1))
    with pytest.raises(ModelReferenceError, match="medusa_num_layers must be a non-negative integer, got -1"):
        read_head(medusa)
    target = write_target(tmp_path / "target", config_extra={"hidden_size": None, "text_config": {"hidden_size": 0}})
    with pytest.raises(ModelReferenceError, match=r"target/config\.json: hidden_size must be a positive integer"):
        check_head_fits(read_head(write_eagle3(tmp_path / "head")), target)
    mtp = write_target(tmp_path / "mtp", config_extra={"model_type": "deepseek_v3", "num_nextn_predict_layers": "1"})
    with pytest.raises(ModelReferenceError, match="num_nextn_predict_layers must be a positive integer, got '1'"):
        read_mtp(mtp)


ODD_VALUES = [None, True, -1, 0, 2**70, 1.5, float("nan"), "16", "", [], [1, "a"], {}, {"a": [None]}]


def field_paths(value, path=()):
    """Every key path of a JSON object, nested objects and list items included."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield path + (key,)
            yield from field_paths(item, path + (key,))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield path + (index,)
            yield from field_paths(item, path + (index,))


def read_and_fit(head_dir: Path, target: Path, method: str | None = None) -> None:
    """read_head + check_head_fits; anything but success or a SpecregError fails the test."""
    from specreg.errors import SpecregError

    try:
        check_head_fits(read_head(head_dir, method=method), target)
    except SpecregError as exc:
        assert "\n" not in str(exc) and str(exc)


@pytest.mark.parametrize("kind", ["speculators", "medusa", "mtp", "tokenizer"])
def test_any_odd_config_value_is_a_specreg_error_never_a_traceback(tmp_path, kind):
    target = write_target(tmp_path / "target", vocab=8 if kind == "tokenizer" else VOCAB)
    edited = "config.json"
    if kind == "tokenizer":  # the head's tokenizer.json, read for the draft token strings
        head_dir = write_eagle3(tmp_path / "head", vocab=8, draft_vocab=8, vocab_map=False, verifier=str(target),
                                strings=token_vocab(8))
        edited = "tokenizer.json"
    elif kind == "speculators":
        head_dir = write_eagle3(tmp_path / "head", verifier=str(target), strings=token_vocab())
    elif kind == "medusa":
        head_dir = write_medusa(tmp_path / "head", base=str(target))
    else:
        config, names = MTP_CASES["deepseek"]
        head_dir = target = write_target(tmp_path / "mtp", config_extra=config, extra_tensors=mtp_tensors(names))
    read_head(head_dir, method="mtp" if kind == "mtp" else None)
    check_head_fits(read_head(head_dir, method="mtp" if kind == "mtp" else None), target)
    original = json.loads((head_dir / edited).read_text())
    paths = list(field_paths(original))
    tried = 0
    for path in paths:
        for odd in ODD_VALUES:
            config = json.loads(json.dumps(original))
            holder = config
            for key in path[:-1]:
                holder = holder[key]
            holder[path[-1]] = odd
            (head_dir / edited).write_text(json.dumps(config))
            read_and_fit(head_dir, target, "mtp" if kind == "mtp" else None)
            tried += 1
    assert tried == len(paths) * len(ODD_VALUES) and len(paths) >= 3


def test_any_truncated_or_flipped_weight_file_is_a_specreg_error(tmp_path):
    target = write_target(tmp_path / "target")
    head_dir = write_eagle3(tmp_path / "head", verifier=str(target))
    weights = head_dir / "model.safetensors"
    data = weights.read_bytes()
    (header_length,) = struct.unpack("<Q", data[:8])
    for cut in [0, 4, 8, 9, header_length // 2, header_length + 8, len(data) - 1]:
        weights.write_bytes(data[:cut])
        read_and_fit(head_dir, target)
    for position in range(0, 8 + header_length, 7):  # every 7th header byte changed
        flipped = bytearray(data)
        flipped[position] ^= 0x5A
        weights.write_bytes(bytes(flipped))
        read_and_fit(head_dir, target)

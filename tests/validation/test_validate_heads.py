"""`Registry.validate` end to end on head pairs built from the session's tiny target: an EAGLE-3
chain and Medusa heads verified as a tree, every check run on our runtime, and the distribution
check drawing from the pair's own drafter (the head's real q)."""

from __future__ import annotations

import pytest
import torch

from helpers import each_draw  # tests/ is on sys.path (tests/conftest.py)
from specreg.registry.store.entities import PairState

CHECKS = ["integrity", "tokenizer", "chat_template", "memory", "equivalence", "distribution", "acceptance",
          "performance"]
TREE = [[0], [1], [0, 0], [0, 1], [0, 0, 0]]


@pytest.fixture(scope="module")
def heads(models, tmp_path_factory):
    """An EAGLE-3 head (random, speculators layout) and Medusa heads (Medusa's initialisation,
    perturbed) for the tiny target."""
    from specreg.runtime.methods.eagle3 import new_eagle3_head, save_eagle3_head
    from specreg.runtime.loading import load_model
    from specreg.runtime.methods.medusa import new_medusa_heads, save_medusa_heads

    root = tmp_path_factory.mktemp("heads")
    target = load_model(models["target"])
    eagle3 = save_eagle3_head(new_eagle3_head(target, aux_layer_ids=(0, 1), seed=2), root / "eagle3", verifier_name_or_path=str(models["target"]))
    medusa = new_medusa_heads(target, num_heads=3, num_layers=1, seed=4)
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for parameter in medusa.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.3 * (parameter.std() + 0.01))
    from specreg.runtime.methods.dflash import new_block_head, save_block_head

    vocab = int(target.get_output_embeddings().weight.shape[0])
    dspark = new_block_head(target, block_size=4, mask_token_id=vocab - 1, aux_layer_ids=(1,), markov_rank=4,
                            sample_from_anchor=True, seed=6)
    with torch.no_grad():
        for name, parameter in dspark.named_parameters():
            if not name.startswith(("embed_tokens", "lm_head")):
                parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.5)
    from specreg.runtime.methods.peagle import new_peagle_head, save_peagle_head

    peagle = new_peagle_head(target, mask_token_id=vocab - 1, aux_layer_ids=(0, 1), seed=7)
    return {"eagle3": eagle3, "medusa": save_medusa_heads(medusa, root / "medusa"),
            "dspark": save_block_head(dspark, root / "dspark", "dspark", str(models["target"])),
            "peagle": save_peagle_head(peagle, root / "peagle", str(models["target"]))}


def test_dspark_pair_validates_with_k_from_its_block(registry, models, heads, golden_path):
    version = registry.register("dsp", target=str(models["target"]), draft=str(heads["dspark"]),
                                method="dspark").version
    assert version.config.num_speculative_tokens == 4  # the block, sample_from_anchor
    outcome = registry.validate("dsp@1", golden=str(golden_path), device="cpu", gpu_memory="1GiB",
                                distribution_samples=2000,
                                checks="integrity,tokenizer,equivalence,distribution,acceptance,performance")
    found = {check.name: check for check in outcome.checks}
    for name in ("integrity", "tokenizer", "equivalence", "distribution", "acceptance"):
        assert found[name].status == "pass", (name, found[name].summary)
    assert found["distribution"].evidence["draft_law"] == (
        "a point mass on the argmax of the dspark head's distribution from the target's hidden states "
        "(greedy draft sampling)")
    performance = found["performance"]
    # one block forward a step: the k to recommend is the block's, no other
    assert performance.figures["recommended_k"] == performance.figures["extrapolated_k"] == 4


def test_peagle_pair_validates_drawing_each_slot_from_the_heads_law(registry, models, heads, golden_path):
    """A P-EAGLE pair end to end: greedy output equal to the target's, the distribution check's
    chi-square tests on one step's draws through the acceptance rule with the head's own law at its
    first slot (the later slots' laws are the reference's: tests/runtime/test_peagle.py), and one
    head forward a step, so the performance check keeps the registered k."""
    version = registry.register("peag", target=str(models["target"]), draft=str(heads["peagle"]), method="peagle",
                                num_speculative_tokens=3).version
    assert version.config.head["parallel"] == {"mask_token_id": version.target.fingerprint.vocab_size - 1}
    # drafts drawn from the head's law (vLLM's draft_sample_method="probabilistic")
    outcome = registry.validate("peag@1", golden=str(golden_path), device="cpu", gpu_memory="1GiB",
                                distribution_samples=2000, draft_sampling="probabilistic",
                                checks="integrity,tokenizer,equivalence,distribution,acceptance,performance")
    found = {check.name: check for check in outcome.checks}
    for name in ("integrity", "tokenizer", "equivalence", "distribution", "acceptance"):
        assert found[name].status == "pass", (name, found[name].summary)
    assert found["distribution"].evidence["draft_law"] == "the peagle head's distribution from the target's hidden states"
    assert found["performance"].figures["recommended_k"] == 3


def test_medusa_pair_validates_on_the_tree_runtime(registry, models, heads, golden_path):
    registry.register("med", target=str(models["target"]), draft=str(heads["medusa"]), method="medusa", tree=TREE)
    outcome = registry.validate("med@1", golden=str(golden_path), device="cpu", gpu_memory="1GiB",
                                distribution_samples=2000)
    found = {check.name: check for check in outcome.checks}
    assert list(found) == CHECKS
    assert found["chat_template"].status == "skip"
    for name in ("tokenizer", "equivalence", "distribution", "acceptance"):
        assert found[name].status == "pass", (name, found[name].summary)
    assert found["equivalence"].figures["exact"] + found["equivalence"].figures.get("near_tie", 0) == 3
    assert "tree's first-depth candidates" in found["distribution"].evidence["draft_law"]
    # per-position acceptance is per depth of the tree: three depths
    assert outcome.passed, [(c.name, c.status, c.summary) for c in outcome.checks]
    baselines = registry.baselines("med@1")
    assert len(baselines["overall"]["per_position_acceptance"]) <= 3
    performance = found["performance"]
    assert performance.status in ("pass", "warn")
    assert performance.figures["tree_nodes"] == 5
    assert 1 <= performance.figures["recommended_k"] <= 3
    assert performance.figures["verify_cost_ratio"] > 0
    assert "recommended tree depth" in performance.summary
    assert outcome.passed and outcome.version.state is PairState.VALIDATED


def test_eagle3_pair_distribution_draws_from_the_heads_own_law(registry, models, heads, golden_path):
    registry.register("eag", target=str(models["target"]), draft=str(heads["eagle3"]), method="eagle3",
                      num_speculative_tokens=3)
    # drafts drawn from the head's law (vLLM's draft_sample_method="probabilistic")
    outcome = registry.validate("eag@1", golden=str(golden_path), device="cpu", gpu_memory="1GiB",
                                distribution_samples=2000, checks="integrity,equivalence,distribution,acceptance",
                                draft_sampling="probabilistic")
    found = {check.name: check for check in outcome.checks}
    assert found["equivalence"].status == "pass", found["equivalence"].summary
    distribution = found["distribution"]
    assert distribution.status == "pass", distribution.summary
    assert distribution.evidence["draft_law"] == "the eagle3 head's distribution from the target's hidden states"
    # a random head's law is spread out: the chance q and p agree is well below 1 (a point mass on
    # the target's top token, the old stand-in, would give the target's top probability instead)
    assert all(0 < prefix["expected_acceptance"] < 1 for prefix in distribution.evidence["prefixes"])


def test_a_broken_tree_rule_fails_the_distribution_check(registry, models, heads, golden_path):
    """Accepting a tree's first candidate whenever it has positive target probability (p/q ignored)
    over-emits the candidates: the chi-square tests see it; equivalence (greedy) cannot."""
    from specreg.runtime.acceptance_rule import tree_rejection_sample

    @each_draw
    def accept_first_candidate(draft_probs, target_probs, node_token_ids, parent_ids, uniforms, generator=None):
        first = int((parent_ids == 0).nonzero()[0])
        if target_probs[0, node_token_ids[first]] > 0:
            return torch.tensor([first]), torch.stack([node_token_ids[first], node_token_ids[first]])
        return tree_rejection_sample(draft_probs, target_probs, node_token_ids, parent_ids, uniforms, generator)

    registry.register("med", target=str(models["target"]), draft=str(heads["medusa"]), method="medusa", tree=TREE)
    outcome = registry.validate("med@1", golden=str(golden_path), device="cpu", distribution_samples=2000,
                                checks="equivalence,distribution", hooks={"tree_acceptance_rule": accept_first_candidate})
    found = {check.name: check for check in outcome.checks}
    assert found["equivalence"].status == "pass"
    assert found["distribution"].status == "fail"
    assert "does not match the target's distribution" in found["distribution"].summary


def test_eagle3_pair_with_a_tree_validates_on_the_tree_runtime(registry, models, heads, golden_path):
    registry.register("eagtree", target=str(models["target"]), draft=str(heads["eagle3"]), method="eagle3",
                      tree=TREE)
    outcome = registry.validate("eagtree@1", golden=str(golden_path), device="cpu", gpu_memory="1GiB",
                                distribution_samples=2000)
    found = {check.name: check for check in outcome.checks}
    for name in ("tokenizer", "equivalence", "distribution", "acceptance"):
        assert found[name].status == "pass", (name, found[name].summary)
    assert found["distribution"].evidence["draft_law"] == "the tree's first-depth candidates (point masses), tree rule"
    assert found["performance"].figures["tree_nodes"] == 5
    assert outcome.passed


@pytest.fixture(scope="module")
def mtp_target(models, tmp_path_factory):
    """The tiny target with one random MTP layer inside (DeepSeek names, num_nextn_predict_layers 1)."""
    from specreg.runtime.loading import load_model
    from specreg.runtime.methods.mtp import new_mtp_head, save_target_with_mtp

    target = load_model(models["target"])
    return save_target_with_mtp(new_mtp_head(target, seed=3), models["target"],
                                tmp_path_factory.mktemp("mtp") / "target-mtp")


def test_mtp_pair_registers_and_validates_through_the_cli(registry, mtp_target, golden_path):
    """`specreg register --method mtp` then `specreg validate` on SQLite: every check runs on our
    runtime, the distribution check drawing from the MTP layer's own law."""
    import json

    from clirun import run

    db = ["--db", registry.db_url]
    registered = run("register", "mtp", "--target", str(mtp_target), "--method", "mtp", "-k", "2", "--user", "alice",
                     *db)
    assert registered.returncode == 0, registered.stderr
    validated = run("validate", "mtp@1", "--golden", str(golden_path), "--device", "cpu",
                    "--gpu-memory", "1GiB", "--distribution-samples", "2000", "--json", *db)
    code, data, err = validated.returncode, json.loads(validated.stdout), validated.stderr
    found = {check["name"]: check for check in data["checks"]}
    assert list(found) == CHECKS
    assert found["chat_template"]["status"] == "skip"
    for name in ("integrity", "tokenizer", "memory", "equivalence", "distribution", "acceptance"):
        assert found[name]["status"] == "pass", (name, found[name]["summary"])
    assert found["equivalence"]["figures"]["exact"] == 3
    assert found["distribution"]["evidence"]["draft_law"] == \
        ("a point mass on the argmax of the mtp head's distribution from the target's hidden states "
         "(greedy draft sampling)")
    assert found["performance"]["status"] in ("pass", "warn") and found["performance"]["figures"]["cost_ratio"] > 0
    assert len(registry.baselines("mtp@1")["overall"]["per_position_acceptance"]) <= 2
    assert code == 0 and data["state"] == "validated", err

"""How a sampled row's chain drafters draw their drafts (DecodeConfig.draft_sampling): "greedy"
(the engines' default) drafts the argmax of the draft logits and hands the acceptance rule a
point-mass q on it; "probabilistic" draws from q and hands the rule q itself. Checked on every
step of a real sampled decode of each chain method, against a fresh greedy drafter fed the
step's verified sequence."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from specreg.errors import RuntimeConfigError
from specreg.runtime import acceptance_rule
from specreg.runtime.decode_config import DecodeConfig, check_config
from specreg.runtime.forward import forward_logits
from specreg.runtime.generate import speculative_generate
from specreg.runtime.methods import drafting_method, load_pair
from specreg.runtime.methods.base import DraftRequest
from specreg.runtime.pair import ModelPair

from .test_block_drafters import block_heads  # noqa: F401 - the fixture: random block heads, the target's own lm_head untouched
from .test_peagle import scaled_up

K = 3


@pytest.fixture(scope="module")
def chain_pairs(tiny_dir, target, tokenizer, drafts, block_heads, tmp_path_factory):  # noqa: F811
    """method -> a pair of the tiny target and a random drafter of that method (random weights:
    only which token is drafted and the q handed over are checked here). The heads' own weights are
    scaled up so that their drafts vary; never the target's embeddings or lm_head they share."""
    from specreg.runtime.methods.eagle3 import new_eagle3_head
    from specreg.runtime.methods.mtp import new_mtp_head, save_target_with_mtp
    from specreg.runtime.methods.peagle import new_peagle_head

    vocab = int(target.get_output_embeddings().weight.shape[0])

    def pair_of(head) -> ModelPair:
        return ModelPair(target, tokenizer, head, vocab)

    mtp_dir = save_target_with_mtp(new_mtp_head(target, seed=4), tiny_dir / "target",
                                   tmp_path_factory.mktemp("draft-sampling") / "mtp")
    return {
        "draft_model": ModelPair(target, tokenizer, drafts["aligned"], vocab),
        "eagle3": pair_of(new_eagle3_head(target, range(1, vocab, 2), seed=4)),
        "mtp": load_pair(mtp_dir, method="mtp"),
        "peagle": pair_of(scaled_up(new_peagle_head(target, mask_token_id=vocab - 1, seed=9), 9)),
        "dflash": pair_of(block_heads["dflash"][1]),
    }


def recorded_steps(pair, method: str, prompt: list[int], draft_sampling: str):
    """A sampled decode's steps: per step (the verified sequence it drafted from, its draft ids,
    the q handed to the rule # [k, vocab]), through the real rejection rule."""
    steps = []

    def recording_rule(draft_probs, target_probs, draft_token_ids, uniforms, generator=None):
        num_accepted, emitted = acceptance_rule.rejection_sample(draft_probs, target_probs, draft_token_ids,
                                                                 uniforms, generator)
        steps.append((draft_token_ids.tolist(), draft_probs.clone(), num_accepted))
        return num_accepted, emitted

    config = DecodeConfig(method=method, k=K, max_new_tokens=14, temperature=0.9, top_k=40, seed=5,
                          eos_token_ids=(), prefill_alone=True, draft_sampling=draft_sampling)
    result = speculative_generate(pair, prompt, config, acceptance_rule=recording_rule)
    # on the engines' schedule the prefill emits the first token alone, then each step its
    # accepted drafts and one token: step i drafted from the prompt and the tokens before it
    recorded, emitted = [], 1
    for draft_ids, probs, num_accepted in steps:
        recorded.append((list(prompt) + result.token_ids[:emitted], draft_ids, probs))
        emitted += num_accepted + 1
    return recorded


def greedy_drafts(pair, method: str, sequence: list[int], k: int) -> list[int]:
    """A fresh drafter of a greedy row (its drafts the argmax of its draft logits) fed the whole
    verified sequence (the target's states of it, for a head) -> its k drafts."""
    config = DecodeConfig(method=method, k=k)
    drafter = drafting_method(method).drafter(pair, [config], [None])
    tokens = torch.tensor([sequence])
    with torch.inference_mode():
        if drafter.hidden_state_ids:
            _, hidden = forward_logits(pair.target, tokens[:, :-1], DynamicCache(config=pair.target.config), 1,
                                       drafter.hidden_state_ids)  # the states that predicted x_2 .. x_n
            drafter.rollback([len(sequence) - 1], [hidden])
        proposal, = drafter.propose([DraftRequest(tokens, list(sequence), k)])
    return proposal.draft_token_ids.tolist()


@pytest.mark.parametrize("method", ["draft_model", "eagle3", "mtp", "peagle", "dflash"])
def test_greedy_draft_sampling_drafts_the_argmax_with_a_point_mass_q(chain_pairs, prompts, method):
    pair = chain_pairs[method]
    steps = recorded_steps(pair, method, prompts[0], "greedy")
    assert len(steps) >= 3
    for index, (sequence, draft_ids, probs) in enumerate(steps):
        assert draft_ids == greedy_drafts(pair, method, sequence, len(draft_ids)), f"step {index}"
        one_hot = torch.nn.functional.one_hot(torch.tensor(draft_ids), probs.shape[-1]).float()
        assert torch.equal(probs, one_hot), f"step {index}"


@pytest.mark.parametrize("method", ["draft_model", "eagle3"])
def test_probabilistic_draft_sampling_hands_the_rule_the_draft_law(chain_pairs, prompts, method):
    pair = chain_pairs[method]
    steps = recorded_steps(pair, method, prompts[0], "probabilistic")
    assert len(steps) >= 3
    for sequence, draft_ids, probs in steps:
        assert torch.allclose(probs.sum(-1), torch.ones(len(draft_ids)))
        # q is the warped draft law: top-k 40 leaves 40 tokens, each drafted one among them
        assert ((probs > 0).sum(-1) == 40).all()
        assert (probs[torch.arange(len(draft_ids)), torch.tensor(draft_ids)] > 0).all()
    # some step's drafts differ from the argmax chain: they were drawn, not taken
    assert any(draft_ids != greedy_drafts(pair, method, sequence, len(draft_ids))
               for sequence, draft_ids, _ in steps)


def test_an_unknown_draft_sampling_is_refused():
    with pytest.raises(RuntimeConfigError, match="draft_sampling = 'top1': use one of greedy, probabilistic"):
        check_config(DecodeConfig(draft_sampling="top1"))

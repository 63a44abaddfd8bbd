"""The rollback check shared by the head drafters' tests (EAGLE-3, MTP): every step's drafts of a
real speculative run equal those of a fresh drafter fed the whole verified sequence's target
states at once, so nothing of a rejected (or own-state) entry survives in the head's cache."""

from __future__ import annotations

import torch
from transformers import DynamicCache

from specreg.runtime import acceptance_rule
from specreg.runtime.decode_config import DecodeConfig
from specreg.runtime.generate import speculative_generate, target_only_generate
from specreg.runtime.head_drafter import HeadDrafter
from specreg.runtime.methods.base import DraftRequest
from specreg.runtime.forward import forward_logits


def assert_drafts_equal_a_fresh_drafter(pair, method: str, prompt: list[int], k: int = 4,
                                        max_new_tokens: int = 30) -> None:
    steps = []  # (verified sequence before the step, without the prefill's token; drafts)
    generated = []

    def recording_rule(draft_token_ids, target_token_ids):
        num_accepted, emitted = acceptance_rule.greedy_accept(draft_token_ids, target_token_ids)
        steps.append((list(prompt) + list(generated), draft_token_ids.tolist()))
        generated.extend(emitted.tolist())
        return num_accepted, emitted

    config = DecodeConfig(method=method, k=k, max_new_tokens=max_new_tokens, eos_token_ids=())
    result = speculative_generate(pair, prompt, config, greedy_rule=recording_rule)
    # the rule sees the steps after the prefill, whose token `generated` lacks: put it back first
    first = target_only_generate(pair, prompt, DecodeConfig(max_new_tokens=1, eos_token_ids=())).token_ids
    assert result.token_ids[:1] == first
    rejected_steps = 0
    for index, (verified, drafts) in enumerate(steps):
        sequence = torch.tensor([verified[:len(prompt)] + first + verified[len(prompt):]])
        fresh = HeadDrafter(pair.draft, pair.vocab_size, [(0.0, None, None, None)])
        with torch.inference_mode():
            _, hidden = forward_logits(pair.target, sequence[:, :-1], DynamicCache(config=pair.target.config), 1,
                                       fresh.hidden_state_ids)
            fresh.rollback([sequence.shape[1] - 1], [hidden])
            proposal, = fresh.propose([DraftRequest(sequence, sequence[0].tolist(), len(drafts))])
            assert proposal.draft_token_ids.tolist() == drafts, f"step {index}"
        following = steps[index + 1][0] if index + 1 < len(steps) else None
        if following is not None and len(following) - len(verified) < k + 1:
            rejected_steps += 1
    assert rejected_steps >= 2  # rollbacks past rejected drafts happened and were checked

"""DSpark: DFlash's block forward (dflash.py), then a Markov head sampled left to right: slot i's
logits gain markov_w2(markov_w1(previous token)), the previous token being the anchor for the
first draft and each draft for the next (vLLM 0.33 v1/worker/gpu/spec_decode/dspark/speculator.py
_sample_sequential; model_executor/models/qwen3_dspark.py DSparkMarkovHead, 'vanilla' only).
With sample_from_anchor (DSpark's default) every slot of the block drafts, the anchor's slot the
first token. The confidence head sizes vLLM's adaptive verification only; it drafts nothing and
is not run here."""

from __future__ import annotations

from specreg.runtime.methods.base import Method
from specreg.runtime.methods.dflash import block_drafter, loader

METHOD = Method(name="dspark", load=loader("dspark"), drafter=block_drafter)

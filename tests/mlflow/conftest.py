"""Fixtures of the MLflow sync tests: pair versions built directly as entities (made-up
fingerprints: this is a unit of the sync) and a validation dict. The session MLflow server
fixture, ``mlflow_server``, comes from tests/conftest.py (defined in tests/mlflow_server.py)."""

from __future__ import annotations

import itertools
import uuid
from datetime import datetime, timezone

import pytest

from specreg.core.types import ModelFingerprint, ModelRef
from specreg.registry.store.entities import PairState, PairVersion, SpecConfig, SpecMethod

_ids = itertools.count(1)


def fingerprint(seed: str) -> ModelFingerprint:
    return ModelFingerprint(
        weights_sha256=f"{seed}-weights".ljust(64, "0"),
        weight_files={"model.safetensors": f"{seed}-file".ljust(64, "0")},
        weight_format="safetensors",
        config_sha256=f"{seed}-config".ljust(64, "0"),
        tokenizer_sha256="shared-tokenizer".ljust(64, "0"),
        chat_template_sha256=None,
        architecture="LlamaForCausalLM",
        model_type="llama",
        vocab_size=512,
        tokenizer_length=500,
        parameter_count=123456,
        dtype="float32",
        max_position_embeddings=256,
    )


def build_pair_version(
    name: str, version: int = 1, state: PairState = PairState.VALIDATED, k: int = 4
) -> PairVersion:
    return PairVersion(
        id=next(_ids),
        name=name,
        version=version,
        target=ModelRef("models/target", "/models/target", None, fingerprint(f"t{name}{version}")),
        draft=ModelRef("models/draft", "/models/draft", "main", fingerprint(f"d{name}{version}")),
        config=SpecConfig(SpecMethod.DRAFT_MODEL, k),
        binding_sha256=f"binding-{name}-{version}".ljust(64, "0"),
        state=state,
        registered_by="tester",
        registered_at=datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc),
    )


def build_validation(verdict: str = "pass") -> dict:
    return {
        "id": uuid.uuid4().hex,
        "verdict": verdict,
        "settings": {"k": 4, "method": "draft_model", "dtype": "float32", "device": "cpu",
                     "temperature": 0.0, "seed": 7},
        "golden_set": {"name": "smoke", "version": 2, "sha256": "golden".ljust(64, "0"), "prompts": 12},
        "runtime": {"torch": "2.13.0", "transformers": "5.24.0", "specreg": "0.1.0"},
        "acceptance": {
            "acceptance_rate": 0.71,
            "mean_acceptance_length": 3.2,
            "per_position": [0.9, 0.8, 0.6, 0.5],
            "per_category": {
                "code": {"acceptance_rate": 0.8, "mean_acceptance_length": 3.6},
                "chat/qa": {"acceptance_rate": 0.6},
            },
            "drafted_tokens": 400,
            "accepted_tokens": 284,
        },
        "performance": {
            "speedup": 1.8,
            "tokens_per_s": 120.0,
            "latency_ms": {"p50": 7.0, "p95": 9.0, "p99": 11.0},
        },
        "equivalence": {"prompts": 12, "exact": 11, "near_tie": 1, "fail": 0},
        "checks": {"tokenizer": "pass", "equivalence": "warn"},  # as validators/suite.py writes it
    }


def unique_pair_name() -> str:
    """Pairs share one session server: each test takes its own pair name."""
    return f"pair-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def pair_name() -> str:
    return unique_pair_name()


@pytest.fixture
def make_pair_version():
    """build_pair_version(name, version=1, state=VALIDATED, k=4) -> PairVersion."""
    return build_pair_version


@pytest.fixture
def make_validation():
    """build_validation(verdict="pass") -> a validation dict with a fresh id."""
    return build_validation

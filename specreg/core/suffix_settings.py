"""vLLM's suffix decoding settings (`method: suffix`, the suffix_decoding_* keys of its
SpeculativeConfig), bound into a suffix pair's config: the registry stores and exports them, the
runtime's suffix drafter (runtime/methods/suffix.py) drafts with them. No heavy imports."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

# vLLM 0.33.0's defaults (vllm/config/speculative.py:538-556)
DEFAULT_MAX_TREE_DEPTH = 24
DEFAULT_MAX_CACHED_REQUESTS = 10000
DEFAULT_MAX_SPEC_FACTOR = 1.0
DEFAULT_MIN_TOKEN_PROB = 0.1


@dataclass(frozen=True)
class SuffixSettings:
    """vLLM's suffix_decoding_* settings, named without the prefix."""

    max_tree_depth: int = DEFAULT_MAX_TREE_DEPTH
    max_cached_requests: int = DEFAULT_MAX_CACHED_REQUESTS
    max_spec_factor: float = DEFAULT_MAX_SPEC_FACTOR
    min_token_prob: float = DEFAULT_MIN_TOKEN_PROB

    def problem(self) -> str | None:
        """What vLLM's SpeculativeConfig._validate_suffix_decoding (speculative.py:1741-1760)
        refuses, in its words, or None."""
        if isinstance(self.max_tree_depth, bool) or not isinstance(self.max_tree_depth, int) or self.max_tree_depth < 1:
            return f"suffix_decoding_max_tree_depth={self.max_tree_depth} must be >= 1"
        if (isinstance(self.max_cached_requests, bool) or not isinstance(self.max_cached_requests, int)
                or self.max_cached_requests < 0):
            return f"suffix_decoding_max_cached_requests={self.max_cached_requests} must be >= 0"
        if self.max_spec_factor < 0:
            return f"suffix_decoding_max_spec_factor={self.max_spec_factor} must be >= 0"
        if not 0 <= self.min_token_prob <= 1:
            return f"suffix_decoding_min_token_prob={self.min_token_prob} must be in [0, 1]"
        return None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def vllm_keys(self) -> dict[str, Any]:
        """The settings as vLLM's speculative_config keys."""
        return {f"suffix_decoding_{name}": value for name, value in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SuffixSettings:
        return cls(**data)

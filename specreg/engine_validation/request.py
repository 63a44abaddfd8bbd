"""What an engine validation is asked (`specreg validate-engine`, `specreg validate --engine`):
one frozen request, the only home of each option's default, checked once when it is made."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from specreg.core.statuses import PARITY_TOLERANCE
from specreg.errors import UsageError

DEFAULT_TIERS = (1, 4)
MAX_CONCURRENCY = 64
MAX_DEADLINE_S = 86_400.0
MAX_THREADS = 256
DTYPES = ("float32", "bfloat16")  # comparable numerics in our runtime and the engines


@dataclass(frozen=True)
class EngineValidationRequest:
    """One engine validation's options; a UsageError (one line naming the option) when they
    cannot run together. ``tiers`` always holds concurrency 1 (parity and equivalence run there),
    sorted. A new option is a field here (with its check below) and its CLI option, named as the
    field (specreg/cli/validate_engine.py)."""

    engine: str
    engine_url: str | None = None  # a server someone else started (vllm, sglang)
    reference_url: str | None = None  # the same engine serving the target without speculation
    model_name: str | None = None  # vLLM's served model name (its metrics label)
    tiers: tuple[int, ...] = DEFAULT_TIERS
    parity_tolerance: float = PARITY_TOLERANCE
    near_tie_tolerance: float | None = None  # default by the GGUF / engine dtype
    dtype: str = "float32"
    threads: int | None = None
    deadline_s: float = 600.0  # one engine request, connect to last byte

    def __post_init__(self) -> None:
        from specreg.registry.deploy.engine_client import ENGINES, check_url

        if self.engine not in ENGINES:
            raise UsageError(f"invalid --engine {self.engine!r}: use one of {', '.join(ENGINES)}")
        if self.engine == "sglang" and not self.engine_url:
            raise UsageError(f"--engine {self.engine} runs against a server you started: pass --engine-url URL")
        if self.engine == "llamacpp" and self.engine_url:
            raise UsageError("--engine llamacpp starts llama-server itself from the pair's export: drop --engine-url")
        if self.engine == "vllm" and not self.engine_url and self.model_name:
            raise UsageError("--engine-model goes with --engine-url: a vLLM started here serves the export's name")
        if self.reference_url and not self.engine_url:
            raise UsageError("--engine-reference-url goes with --engine-url")
        for url in (self.engine_url, self.reference_url):
            if url:
                check_url(url)
        if not self.tiers or any(not 1 <= tier <= MAX_CONCURRENCY for tier in self.tiers):
            raise UsageError(f"invalid --concurrency {','.join(map(str, self.tiers))}: tiers from 1 to {MAX_CONCURRENCY}")
        if self.threads is not None and not 1 <= self.threads <= MAX_THREADS:
            raise UsageError(f"invalid --engine-threads {self.threads}: 1 to {MAX_THREADS}")
        if not 0 < self.parity_tolerance < 1:  # NaN fails this too
            raise UsageError(f"invalid parity tolerance {self.parity_tolerance!r}: use a fraction in (0, 1)")
        if self.near_tie_tolerance is not None and not 0 <= self.near_tie_tolerance < float("inf"):
            raise UsageError(f"invalid near-tie tolerance {self.near_tie_tolerance!r}: use a finite number >= 0")
        if not 0 < self.deadline_s <= MAX_DEADLINE_S:
            raise UsageError(f"invalid --engine-deadline {self.deadline_s!r}: seconds, more than 0 and at most "
                             f"{MAX_DEADLINE_S:g}")
        if self.dtype not in DTYPES:
            raise UsageError(f"invalid --dtype {self.dtype} for an engine validation: {' or '.join(DTYPES)} "
                             f"(comparable numerics)")
        # frozen: the normal form is set once, here, before anything reads the request
        object.__setattr__(self, "tiers", tuple(sorted(set(self.tiers) | {1})))

    @property
    def starts_server(self) -> bool:
        """Whether the engine is started here from the pair's export (llama.cpp; vLLM without a URL)."""
        return not self.engine_url

    def to_dict(self) -> dict[str, Any]:
        """Every option as the engine baseline's report records it ("options")."""
        return {**{field.name: getattr(self, field.name) for field in fields(self)}, "tiers": list(self.tiers)}


def default(option: str) -> Any:
    """The request's default for ``option`` (a field name): what the CLI shows and passes."""
    [found] = [field for field in fields(EngineValidationRequest) if field.name == option]
    return found.default

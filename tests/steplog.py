"""StepLog: the runtime's GenerationMetrics keeping each step as the decode loop reports it, for
tests that compare per-step counts (tests/runtime/test_runtime_config.py, and the same steps fed
to vLLM's own metrics code in tests/engines/test_engine_metrics.py)."""

from __future__ import annotations

from specreg.runtime.metrics import GenerationMetrics


class StepLog(GenerationMetrics):
    """GenerationMetrics that also keeps each step's (drafted, accepted) as the decode loop reports it."""

    def __init__(self):
        super().__init__()
        self.steps = []

    def record_step(self, num_drafted, num_accepted, num_emitted):
        self.steps.append((num_drafted, num_accepted))
        super().record_step(num_drafted, num_accepted, num_emitted)

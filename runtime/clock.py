"""A decode pass's times: honest on asynchronous devices (synchronize) and its own (PassClock),
so that the time its caller keeps it waiting between tokens counts in none of them.
"""

from __future__ import annotations

import time
from typing import Iterator


def synchronize(device) -> None:
    """Make wall-clock timings honest on asynchronous devices."""
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)
    elif device.type == "mps":
        import torch

        torch.mps.synchronize()


class PassClock:
    """A decode pass's own time: perf_counter less the time its caller held the pass between two
    tokens. Every time in a pass's metrics reads it, so what the caller does between tokens (a
    stream's reader; the other pass generate_interleaved runs beside this one) counts in none."""

    def __init__(self):
        self.held = 0.0

    def now(self) -> float:
        return time.perf_counter() - self.held

    def hand_over(self, tokens: Iterator[tuple[int, int]]) -> Iterator[tuple[int, int]]:
        """Yield ``tokens`` to the caller, counting the time it keeps each as held."""
        for item in tokens:
            handed = time.perf_counter()
            yield item
            self.held += time.perf_counter() - handed

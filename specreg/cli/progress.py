"""Progress of long steps for people, on stderr: a tqdm bar when stderr is a terminal, a plain
line every few seconds and at each step's end when it is not (CI logs), nothing when off
(`--json`). Steps report through a plain callable, ``progress(what, done, total, detail="")``:
the runtime and the validators know no printing; the CLI hands them a ``Progress``.
"""

from __future__ import annotations

import sys
import time

LINE_INTERVAL_S = 10.0  # plain lines (not a terminal): at most one a step every this many seconds


def clock(seconds: float) -> str:
    """Seconds as m:ss (h:mm:ss past an hour)."""
    seconds = int(max(0, seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


class Progress:
    """Callable reporter of long steps; ``note(text)`` prints a line between them.

    enabled False (``--json``, library use): silent. stream: stderr unless given; a bar only
    when it is a terminal (``bar`` forces either way, for tests)."""

    def __init__(self, enabled: bool = True, stream=None, bar: bool | None = None,
                 interval: float = LINE_INTERVAL_S):
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.use_bar = (self.stream.isatty() if bar is None else bar) and enabled
        self.interval = interval
        self.what: str | None = None
        self.started = 0.0
        self.last_line: float | None = None  # when the last plain line was printed (None: none yet)
        self.bar = None

    def __call__(self, what: str, done: int, total: int, detail: str = "") -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if what != self.what:
            self.close()
            self.what, self.started, self.last_line = what, now, None
            if self.use_bar:
                from tqdm import tqdm

                self.bar = tqdm(total=total, desc=what, file=self.stream, dynamic_ncols=True, leave=True,
                                bar_format="{desc}: {n_fmt}/{total_fmt} |{bar}| {elapsed}<{remaining}{postfix}")
        if self.bar is not None:
            self.bar.total = total
            self.bar.n = done
            self.bar.set_postfix_str(detail, refresh=False)
            self.bar.refresh()
            if done >= total:
                self.close()
            return
        if done < total and self.last_line is not None and now - self.last_line < self.interval:
            return
        self.last_line = now
        elapsed = now - self.started
        line = f"{what}: {done}/{total}, {clock(elapsed)} elapsed"
        if 0 < done < total:
            line += f", about {clock(elapsed / done * (total - done))} left"
        print(line + (f" ({detail})" if detail else ""), file=self.stream, flush=True)
        if done >= total:
            self.what = None

    def note(self, text: str) -> None:
        """A line for people between the bars (e.g. a finished check)."""
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        self.what = None

"""Progress of long steps for people, on stderr: a tqdm bar when stderr is a terminal, a plain
line every few seconds and at each step's end when it is not (CI logs), nothing when off
(`--json`). Steps report through a plain callable, ``progress(what, done, total, detail="")``:
the runtime and the validators know no printing; the CLI hands them a ``Progress``.

In a log a step that reports nothing for a while (loading models, one long prompt) still
prints a line every ``interval`` seconds, from a heartbeat thread: a CI log that says nothing
for a minute looks like a hung job.
"""

from __future__ import annotations

import sys
import threading
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
        self.done, self.total, self.detail = 0, 0, ""
        self.lock = threading.RLock()  # the heartbeat thread prints too
        self.stopped = threading.Event()
        self.heartbeat: threading.Thread | None = None

    def __call__(self, what: str, done: int, total: int, detail: str = "") -> None:
        if not self.enabled:
            return
        with self.lock:
            self.report(what, done, total, detail)
        if not self.use_bar and self.heartbeat is None and self.interval > 0:
            self.heartbeat = threading.Thread(target=self.beat, name="specreg-progress", daemon=True)
            self.heartbeat.start()

    def beat(self) -> None:
        """Every second: if the current step printed nothing for ``interval`` seconds, say it
        is still running (with its last detail)."""
        while not self.stopped.wait(1.0):
            with self.lock:
                now = time.monotonic()
                if self.what is None or self.last_line is None or now - self.last_line < self.interval:
                    continue
                self.last_line = now
                line = f"{self.what}: {self.done}/{self.total}, {clock(now - self.started)} elapsed"
                print(line + (f" (still {self.detail})" if self.detail else " (still running)"),
                      file=self.stream, flush=True)

    def report(self, what: str, done: int, total: int, detail: str) -> None:
        now = time.monotonic()
        if what != self.what:
            self.end_step()
            self.what, self.started, self.last_line = what, now, None
            if self.use_bar:
                from tqdm import tqdm

                self.bar = tqdm(total=total, desc=what, file=self.stream, dynamic_ncols=True, leave=True,
                                bar_format="{desc}: {n_fmt}/{total_fmt} |{bar}| {elapsed}<{remaining}{postfix}")
        self.done, self.total, self.detail = done, total, detail
        if self.bar is not None:
            self.bar.total = total
            self.bar.n = done
            self.bar.set_postfix_str(detail, refresh=False)
            self.bar.refresh()
            if done >= total:
                self.end_step()
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
        with self.lock:
            if self.bar is not None:
                self.bar.write(text, file=self.stream)
            else:
                print(text, file=self.stream, flush=True)

    def end_step(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        self.what = None

    def close(self) -> None:
        """End the current step and the heartbeat."""
        with self.lock:
            self.end_step()
        self.stopped.set()

"""Progress of long steps for people, on stderr: a tqdm bar when stderr is a terminal, a plain
line every few seconds and at each step's end when it is not (CI logs), nothing when off
(`--json`). Steps report through a plain callable, ``progress(what, done, total, detail="")``:
the runtime and the validators know no printing; the CLI hands them a ``Progress``.

In a log a command that reports nothing for a while (loading models, one long prompt, the time
between two steps, a promote mirroring to MLflow) still prints a line every ``interval``
seconds, from a heartbeat thread that runs from the first report (a titled command: from its
start) to the close: a CI log that says nothing for a minute looks like a hung job. On a
terminal the same thread keeps a bar's elapsed time moving while its step is silent, and a
titled command says what it does at once. Time left is the rate since a step's first item ended
times what is left: the time before it (imports, loading the models) says nothing of the pace.
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
    when it is a terminal (``bar`` forces either way, for tests). title: what the command does
    ("promote chat@1 to production"), printed at once on a terminal and named by the heartbeat
    between steps. A ``total`` of 0 announces a step with no count (one line, its detail)."""

    def __init__(self, enabled: bool = True, stream=None, bar: bool | None = None,
                 interval: float = LINE_INTERVAL_S, title: str | None = None):
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.use_bar = (self.stream.isatty() if bar is None else bar) and enabled
        self.interval = interval
        self.title = title
        self.opened = time.monotonic()
        self.what: str | None = None
        self.finished = ""  # the last step that ended, for the heartbeat between steps
        self.started = 0.0
        self.first_done: tuple[float, int] | None = None  # (when, how many) as the step's first items ended
        self.last_line: float | None = None  # when the step's last plain line was printed (None: none yet)
        self.printed = self.opened  # when anything was last printed (or the command began)
        self.bar = None
        self.done, self.total, self.detail = 0, 0, ""
        self.lock = threading.RLock()  # the heartbeat thread prints too
        self.stopped = threading.Event()
        self.heartbeat: threading.Thread | None = None
        if enabled and title:  # a command that says what it does: from its start
            if self.use_bar:
                self.print_line(f"{title} ...")
            self.start_heartbeat()

    def __call__(self, what: str, done: int, total: int, detail: str = "") -> None:
        if not self.enabled:
            return
        with self.lock:
            self.report(what, done, total, detail)
        self.start_heartbeat()

    def start_heartbeat(self) -> None:
        """The heartbeat thread, once (none with interval 0), until close()."""
        if self.heartbeat is None and self.interval > 0 and not self.stopped.is_set():
            self.heartbeat = threading.Thread(target=self.beat, name="specreg-progress", daemon=True)
            self.heartbeat.start()

    def print_line(self, line: str) -> None:
        print(line, file=self.stream, flush=True)
        self.printed = time.monotonic()

    def beat(self) -> None:
        """Every second: move a bar's clock; if nothing was printed for ``interval`` seconds (a
        bar aside), say the current step (with its last detail), or the command, is still running."""
        while not self.stopped.wait(1.0):
            with self.lock:
                now = time.monotonic()
                if self.bar is not None:
                    self.bar.refresh()  # its elapsed time, which tqdm moves only when drawn
                    continue
                if now - self.printed < self.interval:
                    continue
                if self.what is not None:
                    self.last_line = now
                    line = f"{self.what}: {self.done}/{self.total}, {clock(now - self.started)} elapsed"
                    line += f" (still {self.detail})" if self.detail else " (still running)"
                else:
                    line = (f"{self.title or 'still working'}: {clock(now - self.opened)} elapsed"
                            + (f" (after {self.finished})" if self.finished else " (still running)"))
                self.print_line(line)

    def report(self, what: str, done: int, total: int, detail: str) -> None:
        now = time.monotonic()
        if what != self.what:
            self.end_step()
            if total <= 0:  # an announcement: no count, no bar
                self.note(f"{what}: {detail}" if detail else what)
                self.finished = what
                return
            self.what, self.started, self.last_line, self.first_done = what, now, None, None
            if self.use_bar:
                from tqdm import tqdm

                # time left is ours (time_left): tqdm's would count the step's start (loading) as pace
                self.bar = tqdm(total=total, desc=what, file=self.stream, dynamic_ncols=True, leave=True,
                                bar_format="{desc}: {n_fmt}/{total_fmt} |{bar}| {elapsed}{postfix}")
        self.done, self.total, self.detail = done, total, detail
        if done > 0 and self.first_done is None:
            self.first_done = (now, done)
        if self.bar is not None:
            self.bar.total = total
            self.bar.n = done
            left = self.time_left(now, done, total)
            self.bar.set_postfix_str(", ".join(part for part in (
                f"about {clock(left)} left" if left is not None else "", detail) if part), refresh=False)
            self.bar.refresh()
            self.printed = now
            if done >= total:
                self.end_step()
            return
        if done < total and self.last_line is not None and now - self.last_line < self.interval:
            return
        self.last_line = now
        line = f"{what}: {done}/{total}, {clock(now - self.started)} elapsed"
        left = self.time_left(now, done, total)
        if left is not None:
            line += f", about {clock(left)} left"
        self.print_line(line + (f" ({detail})" if detail else ""))
        if done >= total:
            self.finished, self.what = what, None

    def time_left(self, now: float, done: int, total: int) -> float | None:
        """Seconds left at the pace since the step's first items ended; None before a second
        report of ended items (one item's time includes the step's start: loading, imports)."""
        if self.first_done is None or not self.first_done[1] < done < total:
            return None
        since, counted = self.first_done
        return (now - since) / (done - counted) * (total - done)

    def note(self, text: str) -> None:
        """A line for people between the bars (e.g. a finished check)."""
        if not self.enabled:
            return
        with self.lock:
            if self.bar is not None:
                self.bar.write(text, file=self.stream)
                self.printed = time.monotonic()
            else:
                self.print_line(text)

    def end_step(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if self.what is not None:
            self.finished = self.what
        self.what = None

    def close(self) -> None:
        """End the current step and the heartbeat."""
        with self.lock:
            self.end_step()
        self.stopped.set()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

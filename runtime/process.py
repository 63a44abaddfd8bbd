"""The settings of a process that runs models: how many CPU threads it may use (the one place
that decides it) and silence for the progress bars of the libraries it calls.

Every command that runs models (`specreg demo-pair`, `validate`, `gate --rerun`, the
benchmarks) goes through ``limit_threads`` (the CLI through ``prepare_process`` at start). The rule: ``$SPECREG_THREADS`` when set, else an
explicit ``$OMP_NUM_THREADS``, else the cores this process may run on that other work leaves free
(rounded), at least 1 and never more than those cores; threads beyond the free cores wait
passively. Other work is the 1-minute load average, checked against a tenth of a second of the
CPUs' own counters when the average says some cores are taken: the average still counts, for a
minute, a command that has just ended, and a second `validate` started then would run on one
thread. Spinning OpenMP threads on cores other work holds cost far more than they bring: on the
2-core machine with load 5-18, torch's default (one thread a core) made the demo pair's build
take 52 minutes and > 10 CPU-minutes for 55 CPU-seconds of work, and tests/runtime ran 6x slower
(82 s against 13 s)."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

# the thread pools of the libraries a model run uses: OpenMP / MKL (torch), rayon (tokenizers)
POOL_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "RAYON_NUM_THREADS")


def usable_cpus() -> set[int]:
    """The CPUs this process may run on (its CPU affinity, else all the machine's)."""
    try:
        cpus = set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = set()
    return cpus or set(range(os.cpu_count() or 1))


def usable_cores() -> int:
    """How many CPUs this process may run on."""
    return len(usable_cpus())


def explicit_threads() -> int | None:
    """$SPECREG_THREADS, else $OMP_NUM_THREADS, when set to a positive integer."""
    for variable in ("SPECREG_THREADS", "OMP_NUM_THREADS"):
        value = os.environ.get(variable, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    return None


def cpu_counters(cpus: set[int], path: str = "/proc/stat") -> tuple[int, int] | None:
    """(busy, busy + idle) clock ticks summed over ``cpus`` since boot, None where unreadable.
    Busy is user, nice, system, irq and softirq time; steal (the hypervisor's) counts as neither."""
    busy = total = 0
    try:
        with open(path) as handle:
            for line in handle:
                name, *fields = line.split()
                if not name.startswith("cpu"):
                    break  # the CPUs' lines come first ("cpu" for all, then "cpuN"), then "intr" ...
                if name[3:].isdigit() and int(name[3:]) in cpus:
                    user, nice, system, idle, iowait, irq, softirq = (int(value) for value in fields[:7])
                    busy += user + nice + system + irq + softirq
                    total += user + nice + system + irq + softirq + idle + iowait
    except (OSError, ValueError):
        return None
    return (busy, total) if total else None


@dataclass(frozen=True)
class CpuReading:
    """The usable CPUs' counters (cpu_counters), this process's CPU time and the clock at one
    moment: other_work_since(reading) tells how busy other work kept the CPUs from then on."""

    cpus: frozenset[int]
    counters: tuple[int, int] | None
    own_cpu_s: float
    at: float


def read_cpus() -> CpuReading:
    cpus = frozenset(usable_cpus())
    return CpuReading(cpus, cpu_counters(set(cpus)), time.process_time(), time.perf_counter())


def other_work_since(reading: CpuReading) -> float | None:
    """How many of the usable CPUs other work kept busy since ``reading``: their busy share less
    this process's own CPU time (every thread of it) over the same span; None where the system
    does not expose the counters."""
    after = cpu_counters(set(reading.cpus))
    if reading.counters is None or after is None or after[1] <= reading.counters[1]:
        return None
    busy = len(reading.cpus) * (after[0] - reading.counters[0]) / (after[1] - reading.counters[1])
    wall = time.perf_counter() - reading.at
    own = (time.process_time() - reading.own_cpu_s) / wall if wall > 0 else 0.0
    return max(0.0, busy - own)


def busy_now(window: float = 0.1) -> float | None:
    """How many of the usable CPUs other work keeps busy over the next ``window`` seconds (this
    process sleeps meanwhile), from the CPUs' counters; None where the system does not expose them."""
    reading = read_cpus()
    if reading.counters is None:
        return None
    time.sleep(window)
    return other_work_since(reading)


def free_cores(cores: int | None = None, load: float | None = None) -> int:
    """The cores other work leaves free (rounded), in [1, cores]. ``load`` is how many cores other
    work holds; by default the 1-minute load average, and where that says some cores are taken,
    what the CPUs' counters show now (busy_now), since the average decays over a minute after a
    command ends."""
    cores = usable_cores() if cores is None else cores
    if load is None:
        try:
            load = os.getloadavg()[0]
        except (AttributeError, OSError):
            load = float(cores)  # unknown load: assume busy, one thread
        if rounded_free(cores, load) < cores:
            now = busy_now()
            if now is not None:
                load = now
    return rounded_free(cores, load)


def rounded_free(cores: int, load: float) -> int:
    """The cores ``load`` leaves free, rounded, in [1, cores]."""
    return max(1, min(cores, int(cores - load + 0.5)))


def decide_threads(cores: int | None = None, load: float | None = None) -> int:
    """Threads for torch in this process: explicit_threads() capped at the cores, else the free
    cores (free_cores)."""
    cores = usable_cores() if cores is None else cores
    explicit = explicit_threads()
    if explicit is not None:
        return min(explicit, cores)
    return free_cores(cores, load)


def limit_threads() -> int:
    """Apply decide_threads() to this process and the processes it starts -> the thread count.

    Sets the thread pools' variables (read when torch, MKL or tokenizers start, and inherited
    by engine subprocesses) and, when torch is already imported, torch.set_num_threads."""
    cores = usable_cores()
    explicit = explicit_threads()
    if explicit is not None and min(explicit, cores) == 1:
        free = 1  # one thread is never beyond the free cores: nothing to measure (the tests' case)
    else:
        free = free_cores(cores)  # measured once: the counters take a tenth of a second to read
    threads = decide_threads(cores, load=cores - free)
    for variable in POOL_VARIABLES:
        os.environ[variable] = str(threads)
    if threads > free:
        # more threads than free cores (an explicit setting on a busy machine): OpenMP threads
        # that wait for work sleep instead of spinning, since spinning threads on cores other work
        # holds made training 5-6x slower (docs/benchmarks-log.md). On free cores they keep OpenMP's
        # default (spin a little, then sleep): a forward of a small model is thousands of short
        # parallel regions, and waking sleeping threads for each made validate's decoding of the
        # demo pair 4x slower with 2 threads than with 1.
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return threads


def quiet_libraries() -> None:
    """No progress bars from the libraries we call (transformers' "Writing model shards",
    huggingface_hub's): specreg reports its own steps. Set for torch-free processes too (the
    variable is read when huggingface_hub is imported); transformers is told if already loaded."""
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    if "transformers" in sys.modules:
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()


def prepare_process() -> int:
    """limit_threads() and quiet_libraries(), before anything heavy is imported -> thread count."""
    quiet_libraries()
    return limit_threads()

"""Live acceptance from a serving engine's Prometheus endpoint, checked against the baselines
recorded at validation.

vLLM exposes counters, so the live figures are computed from their deltas between two scrapes
(docs/design.md §4): acceptance_rate = d(accepted tokens) / d(draft tokens) and
mean_acceptance_length = 1 + d(accepted tokens) / d(drafts). SGLang exposes gauges that hold
both figures already (over its own logging window); the live value is the mean of the two
scrapes. TensorRT-LLM's trtllm-serve has no Prometheus speculative-decoding metrics specreg
knows the names of, so observing it is refused with that reason. Each engine's metric names and
reader are in its module (registry/deploy/engines/<engine>.py ``read_metrics``).
"""

from __future__ import annotations

import http.client
import math
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable

from specreg.core.baselines import drift_floor, in_engine_terms, legacy_tau_note, schedule_note
from specreg.errors import SpecregError, UsageError

ENGINES = ("vllm", "sglang", "trtllm")

# The live figures compare_with_baseline checks, against baselines["overall"].
COMPARED = ("acceptance_rate", "mean_acceptance_length")
# A vLLM /metrics page is some hundred KB (histograms per model and engine); 16 MiB bounds the
# memory and parse time a wrong or hostile endpoint can cost.
MAX_RESPONSE_BYTES = 16 * 2**20
MAX_INTERVAL_S = 86_400.0  # a day between the two scrapes at most
SCRAPE_DEADLINE_S = 30.0  # one whole scrape, connect to last byte (a /metrics page takes well under 1 s)


def scrape(url: str, timeout: float = 5.0, max_bytes: int = MAX_RESPONSE_BYTES,
           deadline_s: float = SCRAPE_DEADLINE_S) -> str:
    """GET a Prometheus text endpoint; returns the body. Unreachable endpoint, HTTP error, a body
    over ``max_bytes`` (read no further) or one not complete within ``deadline_s`` -> SpecregError
    naming the URL. ``timeout`` bounds each socket operation; the deadline bounds the whole
    exchange (a server trickling a byte a second never lets a per-read timeout expire)."""
    check_http_url(url, "metrics URL")
    deadline = Deadline(deadline_s)
    opener = urllib.request.build_opener(*deadline.handlers())
    try:
        with deadline, opener.open(url, timeout=timeout) as response:
            body = b""
            while len(body) <= max_bytes:
                chunk = response.read1(min(65536, max_bytes + 1 - len(body)))
                if not chunk:
                    break
                body += chunk
            if deadline.expired:
                raise TimeoutError
            if len(body) > max_bytes:
                raise SpecregError(f"metrics endpoint {url} sent more than {max_bytes} bytes; a metrics page "
                                   f"is far smaller: is this the engine's /metrics?")
            return body.decode("utf-8", errors="replace")
    except SpecregError:
        raise
    except Exception as exc:
        if deadline.expired:  # whatever the cut socket raised on the way
            raise SpecregError(f"metrics endpoint {url} did not send its whole answer within {deadline_s:g} s "
                               f"(a stalled or trickling server); observe again or raise --deadline") from None
        if isinstance(exc, urllib.error.HTTPError):
            raise SpecregError(f"metrics endpoint {url} answered HTTP {exc.code} {exc.reason}") from None
        if isinstance(exc, urllib.error.URLError):
            raise SpecregError(f"cannot reach metrics endpoint {url}: {exc.reason}") from None
        if isinstance(exc, (TimeoutError, OSError, http.client.HTTPException)):
            raise SpecregError(f"cannot read metrics endpoint {url}: {exc or type(exc).__name__}") from None
        raise


def check_http_url(url: str, what: str) -> str:
    """``url`` when it is http(s)://HOST[:PORT][/PATH] that urllib can send a request to;
    UsageError naming ``what`` otherwise (an unclosed IPv6 bracket, a space or control character,
    a port that is not a number, no host)."""
    problem = None
    try:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            problem = "must be http://HOST:PORT or https://HOST:PORT"
        else:
            parsed.port  # noqa: B018 - raises ValueError for a port that is not one
    except ValueError as exc:
        problem = f"is not a URL ({exc})"
    if problem is None and any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in url):
        problem = "has a space or control character"
    if problem:
        raise UsageError(f"{what} {' '.join(repr(url).split())[:200]} {problem}")
    return url


class Deadline:
    """A total time limit on one HTTP exchange: when it passes, every socket the exchange opened is
    shut down, so the connect, header or body read blocked on it returns at once (context manager;
    ``handler`` gives urllib handlers whose connections register their sockets here)."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.expired = False
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        self.timer = threading.Timer(seconds, self.expire)
        self.timer.daemon = True

    def __enter__(self) -> "Deadline":
        self.timer.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.timer.cancel()

    def expire(self) -> None:
        with self.lock:
            self.expired = True
            for sock in self.sockets:
                shut(sock)

    def watch(self, sock: socket.socket) -> socket.socket:
        with self.lock:
            self.sockets.append(sock)
            if self.expired:
                shut(sock)
        return sock

    def handlers(self) -> list[urllib.request.BaseHandler]:
        """urllib handlers for http and https whose connections' raw sockets (before any TLS
        handshake) this deadline watches, and one that follows a redirect only on the same host."""
        deadline = self

        def watched(connection_class):
            class Connection(connection_class):
                def __init__(self, *args, **kwargs):
                    super().__init__(*args, **kwargs)
                    self._create_connection = lambda *a, **k: deadline.watch(socket.create_connection(*a, **k))
            return Connection

        class Handler(urllib.request.HTTPHandler):
            def http_open(self, request):
                return self.do_open(watched(http.client.HTTPConnection), request)

        class SecureHandler(urllib.request.HTTPSHandler):
            def https_open(self, request):
                return self.do_open(watched(http.client.HTTPSConnection), request, context=self._context)

        return [Handler(), SecureHandler(), SameHostRedirects()]


class SameHostRedirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only to the same scheme, host and port: a server named by the user may
    move a path, never send specreg's request (a prompt, a scrape) to another address, e.g. an
    internal one it can reach and the user did not name."""

    def redirect_request(self, request, fp, code, msg, headers, new_url):
        old, new = urllib.parse.urlsplit(request.full_url), urllib.parse.urlsplit(new_url)
        try:
            same = (old.scheme, old.hostname, old.port) == (new.scheme, new.hostname, new.port)
        except ValueError:  # an unparsable port in the Location header
            same = False
        if not same:
            raise SpecregError(f"{request.full_url} redirected (HTTP {code}) to another host, "
                               f"{' '.join(str(new_url).split())[:200]!r}: not followed")
        return super().redirect_request(request, fp, code, msg, headers, new_url)


def shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # already closed
        pass


def parse_samples(text: str, source: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample of a Prometheus text body as (sample name, labels, value).

    Sample names are the exposed names (a counter's sample keeps its ``_total``), which is how
    the engines document them. A body that is not Prometheus text -> SpecregError naming source.
    """
    from prometheus_client.parser import text_string_to_metric_families

    try:
        return [
            (sample.name, dict(sample.labels), float(sample.value))
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        ]
    except Exception as exc:  # the parser raises ValueError, IndexError, ... on foreign bodies
        first_line = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        raise SpecregError(f"{source} did not return Prometheus text format: {first_line}") from None


def select(samples: list[tuple[str, dict[str, str], float]], name: str, model_name: str | None,
           source: str) -> list[tuple[dict[str, str], float]]:
    """The (labels, value) series of one metric, filtered by ``model_name`` when given.
    Missing metric, or no series for that model -> SpecregError naming which."""
    series = [(labels, value) for sample_name, labels, value in samples if sample_name == name]
    if not series:
        raise SpecregError(f"{source} has no metric {name} (is speculative decoding enabled on this engine?)")
    if model_name is None:
        return series
    matching = [(labels, value) for labels, value in series if labels.get("model_name") == model_name]
    if not matching:
        seen = sorted({labels.get("model_name", "<none>") for labels, _ in series})
        raise SpecregError(f"{source} has {name} but not for model_name={model_name!r} (seen: {', '.join(seen)})")
    return matching


def read_engine(text: str, engine: str, model_name: str | None, source: str) -> dict[str, Any]:
    """Parse one scrape body and read the engine's speculative-decoding metrics from it."""
    from specreg.registry.deploy.engines import engine_modules

    check_engine(engine)
    samples = parse_samples(text, source)
    return engine_modules()[engine].read_metrics(samples, model_name, source)


def check_engine(engine: str) -> None:
    if engine == "trtllm":
        raise UsageError(
            "observe --engine trtllm is not supported: trtllm-serve 1.2 exposes no Prometheus "
            "speculative-decoding metrics with names specreg knows; use its acceptance_length_threshold "
            "(set by `specreg export --format trtllm`) or observe a vllm or sglang deployment"
        )
    if engine not in ENGINES:
        raise UsageError(f"unknown engine {engine!r}; known: vllm, sglang")


def live_figures(first: dict[str, Any], second: dict[str, Any], engine: str, interval_s: float,
                 source: str) -> dict[str, Any]:
    """Live figures over the interval between two readings of ``read_engine``.

    Out: {"engine", "interval_s", "acceptance_rate", "mean_acceptance_length",
    "per_position_acceptance", ...counts}; the figures are None when no drafts happened.
    """
    if engine == "sglang":
        return {
            "engine": engine,
            "interval_s": interval_s,
            "acceptance_rate": (first["acceptance_rate"] + second["acceptance_rate"]) / 2,
            "mean_acceptance_length": (first["mean_acceptance_length"] + second["mean_acceptance_length"]) / 2,
            "per_position_acceptance": None,
            "samples": [first, second],
        }
    deltas = {key: second[key] - first[key] for key in ("drafts", "draft_tokens", "accepted_tokens")}
    if any(delta < 0 for delta in deltas.values()):
        raise SpecregError(f"{source}: vLLM counters went backwards between scrapes (engine restarted?); observe again")
    drafts, draft_tokens, accepted = deltas["drafts"], deltas["draft_tokens"], deltas["accepted_tokens"]
    positions = sorted(second["accepted_per_position"])
    per_position = None
    if drafts > 0 and positions:
        # vLLM proposes k tokens in every draft, so every draft reaches every position.
        per_position = [
            (second["accepted_per_position"][p] - first["accepted_per_position"].get(p, 0.0)) / drafts
            for p in positions
        ]
    return {
        "engine": engine,
        "interval_s": interval_s,
        "drafts": drafts,
        "draft_tokens": draft_tokens,
        "accepted_tokens": accepted,
        "acceptance_rate": accepted / draft_tokens if draft_tokens > 0 else None,
        "mean_acceptance_length": 1.0 + accepted / drafts if drafts > 0 else None,
        "per_position_acceptance": per_position,
    }


def observe(url: str, engine: str = "vllm", interval: float = 30.0, model_name: str | None = None,
            sleep: Callable[[float], None] = time.sleep, timeout: float = 5.0,
            deadline_s: float = SCRAPE_DEADLINE_S) -> dict[str, Any]:
    """Scrape ``url`` twice, ``interval`` seconds apart (each scrape within ``deadline_s``), and
    return the live figures of ``live_figures`` plus "url", "model_name" and "observed_at" (UTC ISO time)."""
    from datetime import datetime, timezone

    check_engine(engine)
    check_interval(interval)
    check_seconds("--deadline", deadline_s)
    first = read_engine(scrape(url, timeout, deadline_s=deadline_s), engine, model_name, url)
    started = time.monotonic()
    sleep(interval)
    second = read_engine(scrape(url, timeout, deadline_s=deadline_s), engine, model_name, url)
    live = live_figures(first, second, engine, max(time.monotonic() - started, interval), url)
    live.update({"url": url, "model_name": model_name,
                 "observed_at": datetime.now(timezone.utc).isoformat(timespec="seconds")})
    return live


def check_interval(interval: float) -> None:
    """UsageError unless the interval is a finite number of seconds in (0, MAX_INTERVAL_S]:
    NaN, inf and 1e300 would crash time.sleep."""
    check_seconds("--interval", interval)


def check_seconds(option: str, seconds: float) -> None:
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) \
            or not 0 < seconds <= MAX_INTERVAL_S:
        raise UsageError(f"{option} {seconds!r} must be a number of seconds above 0 and at most {MAX_INTERVAL_S:g}")


def reading_problems(live: dict[str, Any], k: int | None = None) -> list[str]:
    """Why the live figures cannot be a speculative-decoding reading (empty: they can).

    Checked whatever the engine: 0 <= acceptance_rate <= 1; 1 <= mean_acceptance_length <= k + 1
    (k: the baselines' depth, when recorded); per-position rates in [0, 1], never rising with the
    position; from counters, accepted <= draft tokens and drafts <= draft tokens. Any of these
    broken means a wrong endpoint, a buggy exporter or a forged page, never an "ok"."""
    problems = []

    def bad(value) -> bool:
        return isinstance(value, (int, float)) and not math.isfinite(value)

    rate, tau = live.get("acceptance_rate"), live.get("mean_acceptance_length")
    accepted, draft_tokens, drafts = live.get("accepted_tokens"), live.get("draft_tokens"), live.get("drafts")
    if isinstance(accepted, (int, float)) and isinstance(draft_tokens, (int, float)) and accepted > draft_tokens:
        problems.append(f"{accepted:g} tokens accepted but only {draft_tokens:g} drafted in the interval")
    if isinstance(drafts, (int, float)) and isinstance(draft_tokens, (int, float)) and drafts > draft_tokens:
        problems.append(f"{drafts:g} drafts but only {draft_tokens:g} draft tokens in the interval")
    if rate is not None and (bad(rate) or not 0.0 <= rate <= 1.0):
        problems.append(f"acceptance_rate {rate:g} is not a rate between 0 and 1")
    if tau is not None and (bad(tau) or tau < 1.0):
        problems.append(f"mean_acceptance_length {tau:g} is below 1 (every step emits at least one token)")
    elif tau is not None and isinstance(k, int) and tau > k + 1:
        problems.append(f"mean_acceptance_length {tau:g} is above k + 1 = {k + 1} (the validated depth k = {k})")
    positions = live.get("per_position_acceptance") or []
    if any(bad(p) or not 0.0 <= p <= 1.0 for p in positions):
        problems.append("per-position acceptance outside [0, 1]: " + ", ".join(f"{p:g}" for p in positions))
    elif any(later > earlier + 1e-9 for earlier, later in zip(positions, positions[1:])):
        problems.append("per-position acceptance rises with the position (position i + 1 is accepted only "
                        "after position i): " + ", ".join(f"{p:g}" for p in positions))
    return problems


def compare_with_baseline(live: dict[str, Any], baselines: dict[str, Any] | None, tolerance: float = 0.1) -> dict[str, Any]:
    """Compare live figures with baselines["overall"] (read in the engines' terms, see
    specreg.core.baselines: a baseline recorded before tau was counted as the engines count it
    is not compared on tau, and ``not_compared`` says why).

    A figure drifts when it falls below its drift floor (specreg.core.baselines.drift_floor);
    higher is never drift. Out: {"verdict": "ok" | "drift" | "no-data" | "invalid", "exit_code":
    0 | 100 | 1 | 1, "reasons": [str], "checks": [{"metric", "live", "baseline", "floor", "ok"}],
    "not_compared": [str], "notes": [str] (a baseline counted on the earlier decode schedule:
    core.baselines.schedule_note), "tolerance"}. "no-data" (no drafts in the interval) and "invalid" (the
    reading cannot be true: reading_problems) cannot be judged, so their exit code fails closed
    (1), as docs/design.md §7 asks.
    """
    if not 0.0 <= tolerance < 1.0:
        raise UsageError(f"tolerance {tolerance} must be in [0, 1)")
    notes = [note] if (note := schedule_note(baselines)) else []
    baselines = in_engine_terms(baselines) or {}
    overall = baselines.get("overall") or {}
    if not isinstance(overall.get("acceptance_rate"), (int, float)):
        raise SpecregError("no recorded acceptance baseline to compare with (validate the version first)")
    not_compared = [note] if (note := legacy_tau_note(baselines)) else []
    checks, reasons = [], []
    for metric in COMPARED:
        baseline = overall.get(metric)
        if not isinstance(baseline, (int, float)):
            continue
        value = live.get(metric)
        floor = drift_floor(metric, baseline, tolerance)
        ok = None if value is None else value >= floor
        checks.append({"metric": metric, "live": value, "baseline": baseline, "floor": floor, "ok": ok})
        if value is None:
            reasons.append(f"{metric}: no speculative drafts during the interval, nothing to compare")
        elif not ok:
            reasons.append(f"{metric} {value:.4f} is below {floor:.4f} (baseline {baseline:.4f} - {tolerance:.0%}"
                           + (" of the accepted part" if metric == "mean_acceptance_length" else "") + ")")
    problems = reading_problems(live, baselines.get("k"))
    if problems:
        verdict, reasons = "invalid", [f"invalid reading: {problem}" for problem in problems]
        for check in checks:
            check["ok"] = None
    elif any(check["ok"] is False for check in checks):
        verdict = "drift"
    elif any(check["ok"] is None for check in checks):
        verdict = "no-data"
    else:
        verdict = "ok"
    exit_code = {"ok": 0, "drift": 100, "no-data": 1, "invalid": 1}[verdict]
    return {"verdict": verdict, "exit_code": exit_code, "reasons": reasons, "checks": checks,
            "not_compared": not_compared, "notes": notes, "tolerance": tolerance}

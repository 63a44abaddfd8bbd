"""Driving a serving engine with token-id prompts and reading its acceptance the engine's way
(``specreg validate --engine``). Only the standard library: the engines are reached over HTTP.

Per engine (each read against that engine's released code):
- llama.cpp ``llama-server`` (tools/server): ``POST /v1/completions`` with the prompt as token
  ids; ``verbose`` puts the generated ids in ``__verbose.tokens`` (``return_tokens``), and
  ``timings.draft_n`` / ``timings.draft_n_accepted`` count drafted and accepted tokens of the
  request. Verify steps and per-position acceptance are only in ``/metrics``
  (``llamacpp:spec_decode_num_drafts_total`` ... vLLM's names under its prefix), which is
  updated when a slot is released, before the next task: a scrape after a response has it.
- vLLM (``vllm serve``): ``POST /v1/completions`` with ``return_token_ids``; the
  ``vllm:spec_decode_*`` counters of ``/metrics``; per request ``metrics.speculative_decoding``
  (``num_spec_steps``, ``num_draft_tokens``, ``num_accepted_draft_tokens``,
  ``acceptance_histogram``) when the server runs with ``--per-request-spec-decode-metrics``;
  near-tie evidence: ``logprobs: N`` with ``return_tokens_as_token_ids`` (vllm_top_logprobs).
- SGLang: ``POST /generate`` with ``input_ids``; ``meta_info`` has ``completion_tokens`` and
  ``spec_verify_ct`` (τ = completion_tokens / spec_verify_ct, SGLang's own figure), and
  ``spec_num_correct_drafts`` / ``spec_num_proposed_drafts`` / ``spec_correct_drafts_histogram``
  (length: the most drafts one step accepted + 1); near-tie evidence: ``return_logprob`` with
  ``top_logprobs_num`` -> ``output_top_logprobs`` (sglang_top_logprobs).
"""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

from specreg.errors import SpecregError, UsageError

ENGINES = ("llamacpp", "vllm", "sglang")
MAX_BODY_BYTES = 64 * 2**20
DEADLINE_S = 600.0  # one engine call, connect to last byte: a long greedy completion on a CPU
MAX_COUNT = 2**53  # a count or token id: past this a JSON number is no longer exact


@dataclass
class EngineCompletion:
    """One greedy completion as the engine reported it. ``draft_steps`` and
    ``accepted_per_position`` are None where the response does not carry them (llama.cpp: they
    come from /metrics deltas)."""

    token_ids: list[int]
    finish_reason: str | None
    seconds: float
    drafted: int | None = None
    accepted: int | None = None
    draft_steps: int | None = None
    accepted_per_position: list[int] | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = None  # per generated token: [(id, logprob)] best first
    raw_spec: dict[str, Any] | None = None  # the engine's own per-request figures, as sent


@dataclass
class Counters:
    """Speculative-decoding counter totals of one /metrics scrape (llama.cpp, vLLM)."""

    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted_tokens: float = 0.0
    accepted_per_position: dict[int, float] = field(default_factory=dict)

    def minus(self, before: "Counters", source: str) -> "Counters":
        """The counts between two scrapes; counters that went backwards -> SpecregError."""
        delta = Counters(self.drafts - before.drafts, self.draft_tokens - before.draft_tokens,
                         self.accepted_tokens - before.accepted_tokens,
                         {p: v - before.accepted_per_position.get(p, 0.0) for p, v in self.accepted_per_position.items()})
        if min(delta.drafts, delta.draft_tokens, delta.accepted_tokens, *delta.accepted_per_position.values(), 0) < 0:
            raise SpecregError(f"{source}: speculative-decoding counters went backwards (engine restarted?)")
        return delta


def check_url(url: str) -> str:
    from specreg.registry.deploy.live_metrics import check_http_url

    return check_http_url(url, "engine URL").rstrip("/")


def http_json(url: str, body: dict | None = None, timeout: float = DEADLINE_S) -> Any:
    """GET (body None) or POST JSON -> the decoded JSON answer (a JSON object). ``timeout``: the
    whole exchange, connect to last byte (live_metrics.Deadline: a server trickling a byte a second
    never lets a per-read timeout expire); redirects only on the same host. Errors ->
    SpecregError naming the URL and, for an HTTP error, the engine's own message."""
    import http.client

    from specreg.registry.deploy.live_metrics import Deadline

    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    deadline = Deadline(timeout)
    opener = urllib.request.build_opener(*deadline.handlers())
    try:
        with deadline:
            try:
                with opener.open(request, timeout=timeout) as response:
                    raw = read_upto(response, MAX_BODY_BYTES + 1)
            except urllib.error.HTTPError as exc:  # its body read under the same deadline
                detail = read_upto(exc, 2000).decode("utf-8", "replace").strip()
                raise SpecregError(f"{url} answered HTTP {exc.code}: {' '.join(detail.split())[:300]}") from None
            if deadline.expired:
                raise TimeoutError
    except SpecregError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever a cut or foreign socket raises: one line
        if deadline.expired:
            raise SpecregError(f"{url} did not send its whole answer within {timeout:g} s (a stalled or trickling "
                               f"server); raise --engine-deadline if the engine is just slow") from None
        if isinstance(exc, urllib.error.URLError):
            raise SpecregError(f"cannot reach {url}: {exc.reason}") from None
        if isinstance(exc, (TimeoutError, OSError, http.client.HTTPException, ValueError)):
            raise SpecregError(f"cannot read {url}: {' '.join(str(exc).split())[:200] or type(exc).__name__}") from None
        raise
    if len(raw) > MAX_BODY_BYTES:
        raise SpecregError(f"{url} sent more than {MAX_BODY_BYTES} bytes")
    try:
        answer = json.loads(raw)
    except (ValueError, RecursionError):
        raise SpecregError(f"{url} did not answer JSON: {raw[:120]!r}") from None
    if not isinstance(answer, dict):
        raise SpecregError(f"{url} answered a JSON {type(answer).__name__}, not an object")
    return answer


def read_upto(response, limit: int) -> bytes:
    """At most ``limit`` bytes of a response, read as they arrive (each read returns what came)."""
    body = b""
    while len(body) < limit:
        chunk = response.read1(min(65536, limit - len(body))) if hasattr(response, "read1") \
            else response.read(limit - len(body))
        if not chunk:
            break
        body += chunk
    return body


# --- the answer's fields, checked: a count is a finite non-negative integer, a list a list ---------

def obj(value: Any, field_name: str, url: str) -> dict:
    """``value`` when it is a JSON object (None reads as {}); SpecregError naming the field otherwise."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SpecregError(f"{url}: {field_name} is {_shown(value)}, not an object")
    return value


def seq(value: Any, field_name: str, url: str) -> list:
    """``value`` when it is a JSON list (None reads as []); SpecregError naming the field otherwise."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise SpecregError(f"{url}: {field_name} is {_shown(value)}, not a list")
    return value


def count(value: Any, field_name: str, url: str, *, upper: int = MAX_COUNT) -> int:
    """A count or token id the engine sent: a finite integer from 0 to ``upper`` (an integral float
    such as 3.0 reads as 3); SpecregError naming the field for NaN, infinity, a fraction, a string,
    a boolean or a negative number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecregError(f"{url}: {field_name} is {_shown(value)}, not a count")
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        raise SpecregError(f"{url}: {field_name} is {_shown(value)}, not a whole finite number")
    if not 0 <= value <= upper:
        raise SpecregError(f"{url}: {field_name} is {_shown(value)}, outside 0..{upper}")
    return int(value)


def counts(value: Any, field_name: str, url: str) -> list[int]:
    return [count(item, f"{field_name}[{i}]", url) for i, item in enumerate(seq(value, field_name, url))]


def number(value: Any, field_name: str, url: str) -> float:
    """A finite real number (a log-probability); SpecregError naming the field otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise SpecregError(f"{url}: {field_name} is {_shown(value)}, not a finite number")
    return float(value)


def _shown(value: Any) -> str:
    return " ".join(repr(value).split())[:80]


def http_text(url: str, timeout: float = 30.0) -> str:
    from specreg.registry.deploy.live_metrics import scrape

    return scrape(url, timeout)


def complete(engine: str, base_url: str, prompt_ids: list[int], max_tokens: int, *, model: str | None = None,
             top_logprobs: int = 0, timeout: float = DEADLINE_S) -> EngineCompletion:
    """One greedy completion of ``prompt_ids`` (token ids, sent as ids: no re-tokenization) by
    the engine at ``base_url`` -> EngineCompletion. ``top_logprobs``: also return the engine's
    top-n log-probabilities of every generated position (the near-tie evidence). ``timeout``:
    the whole call. Every field read is checked (a count a finite non-negative integer, a list
    a list): a malformed answer is one SpecregError naming the field."""
    started = time.perf_counter()
    if engine == "llamacpp":
        body = {"prompt": list(prompt_ids), "max_tokens": max_tokens, "temperature": 0.0, "cache_prompt": False,
                "return_tokens": True, "verbose": True, "stream": False}
        if top_logprobs:
            body["n_probs"] = top_logprobs
        url = f"{base_url}/v1/completions"
        answer = http_json(url, body, timeout)
        seconds = time.perf_counter() - started
        verbose = obj(answer.get("__verbose"), "__verbose", url)
        timings = obj(answer.get("timings"), "timings", url)
        choice = first_choice(answer, url)
        probabilities = None
        if top_logprobs:
            # server-task.cpp probs_vector_to_json: per token "top_logprobs" [{"id", "logprob"}] (the
            # target's softmax before sampling, n_probs of them, best first)
            probabilities = []
            for i, entry in enumerate(seq(verbose.get("completion_probabilities"), "completion_probabilities", url)):
                where = f"completion_probabilities[{i}]"
                tops = seq(obj(entry, where, url).get("top_logprobs"), f"{where}.top_logprobs", url)
                probabilities.append([(count(obj(p, f"{where}.top_logprobs[]", url).get("id"), f"{where}.id", url),
                                       number(p.get("logprob"), f"{where}.logprob", url)) for p in tops])
        return EngineCompletion(
            token_ids=counts(verbose.get("tokens"), "__verbose.tokens", url), finish_reason=finish(choice, url),
            seconds=seconds, drafted=count(timings.get("draft_n", 0), "timings.draft_n", url),
            accepted=count(timings.get("draft_n_accepted", 0), "timings.draft_n_accepted", url),
            top_logprobs=probabilities,
            raw_spec={key: timings[key] for key in ("draft_n", "draft_n_accepted") if key in timings})
    if engine == "vllm":
        body = {"prompt": list(prompt_ids), "max_tokens": max_tokens, "temperature": 0.0, "return_token_ids": True,
                "stream": False}
        if model:
            body["model"] = model
        if top_logprobs:
            # ids as "token_id:N" keys, not decoded text (which two ids can share)
            body["logprobs"] = top_logprobs
            body["return_tokens_as_token_ids"] = True
        url = f"{base_url}/v1/completions"
        answer = http_json(url, body, timeout)
        seconds = time.perf_counter() - started
        choice = first_choice(answer, url)
        spec = obj(obj(answer.get("metrics"), "metrics", url).get("speculative_decoding"),
                   "metrics.speculative_decoding", url) or None
        completion = EngineCompletion(token_ids=counts(choice.get("token_ids"), "choices[0].token_ids", url),
                                      finish_reason=finish(choice, url), seconds=seconds, raw_spec=spec,
                                      top_logprobs=vllm_top_logprobs(choice, url) if top_logprobs else None)
        if spec:
            where = "metrics.speculative_decoding"
            histogram = counts(spec.get("acceptance_histogram"), f"{where}.acceptance_histogram", url)
            completion.drafted = count(spec.get("num_draft_tokens"), f"{where}.num_draft_tokens", url)
            completion.accepted = count(spec.get("num_accepted_draft_tokens"), f"{where}.num_accepted_draft_tokens",
                                        url)
            completion.draft_steps = count(spec.get("num_spec_steps"), f"{where}.num_spec_steps", url)
            # histogram[j]: steps that accepted exactly j drafts -> accepted at position i: steps with j > i
            completion.accepted_per_position = [sum(histogram[i + 1:]) for i in range(max(len(histogram) - 1, 0))]
        return completion
    if engine == "sglang":
        body = {"input_ids": list(prompt_ids), "sampling_params": {"temperature": 0.0, "max_new_tokens": max_tokens},
                "stream": False}
        if top_logprobs:
            # logprob_start_len -1: the generated tokens only, not the prompt's
            body.update(return_logprob=True, top_logprobs_num=top_logprobs, logprob_start_len=-1)
        url = f"{base_url}/generate"
        answer = http_json(url, body, timeout)
        seconds = time.perf_counter() - started
        meta = obj(answer.get("meta_info"), "meta_info", url)
        reason = meta.get("finish_reason")
        completion = EngineCompletion(token_ids=counts(answer.get("output_ids"), "output_ids", url),
                                      finish_reason=finish({"finish_reason": reason.get("type")
                                                            if isinstance(reason, dict) else reason}, url),
                                      seconds=seconds,
                                      raw_spec={key: value for key, value in meta.items() if key.startswith("spec_")
                                                or key == "completion_tokens"},
                                      top_logprobs=sglang_top_logprobs(meta, url) if top_logprobs else None)
        if meta.get("spec_verify_ct"):
            completion.draft_steps = count(meta["spec_verify_ct"], "meta_info.spec_verify_ct", url)
            if "spec_num_proposed_drafts" in meta:
                completion.drafted = count(meta["spec_num_proposed_drafts"], "meta_info.spec_num_proposed_drafts", url)
                completion.accepted = count(meta.get("spec_num_correct_drafts"), "meta_info.spec_num_correct_drafts",
                                            url)
            histogram = counts(meta.get("spec_correct_drafts_histogram"), "meta_info.spec_correct_drafts_histogram",
                               url)
            if histogram:
                completion.accepted_per_position = [sum(histogram[i + 1:]) for i in range(len(histogram) - 1)]
        return completion
    raise UsageError(f"unknown engine {engine!r}: use one of {', '.join(ENGINES)}")


def first_choice(answer: dict, url: str) -> dict:
    choices = seq(answer.get("choices"), "choices", url)
    return obj(choices[0], "choices[0]", url) if choices else {}


def finish(choice: dict, url: str) -> str | None:
    reason = choice.get("finish_reason")
    if reason is not None and not isinstance(reason, str):
        raise SpecregError(f"{url}: finish_reason is {_shown(reason)}, not a string")
    return reason[:64] if reason is not None else None


def vllm_top_logprobs(choice: dict[str, Any], url: str) -> list[list[tuple[int, float]]]:
    """A /v1/completions choice asked with ``logprobs`` and ``return_tokens_as_token_ids`` ->
    per generated token [(id, logprob)] best first. vLLM (completion/serving.py
    _create_completion_logprobs): ``logprobs.top_logprobs`` is one {"token_id:N": logprob} per
    token (None where it has none), the sampled token and the top ``logprobs`` of the target."""
    field_name = "choices[0].logprobs.top_logprobs"
    logprobs = choice.get("logprobs")
    positions = logprobs.get("top_logprobs") if isinstance(logprobs, dict) else None
    if not isinstance(positions, list):
        raise SpecregError(f"{url}: the answer has no {field_name} (the server sent no log-probabilities)")
    tops = []
    for i, entry in enumerate(positions):
        pairs = []
        for key, logprob in obj(entry, f"{field_name}[{i}]", url).items():
            prefix, _, digits = str(key).partition(":")
            if prefix != "token_id" or not digits.isdigit() or len(digits) > 16:
                raise SpecregError(f"{url}: {field_name} has the key {_shown(key)}, not 'token_id:N' "
                                   f"(return_tokens_as_token_ids not honoured)")
            pairs.append((int(digits), number(logprob, f"{field_name}[{i}][{key}]", url)))
        tops.append(sorted(pairs, key=lambda pair: -pair[1]))
    return tops


def sglang_top_logprobs(meta: dict[str, Any], url: str) -> list[list[tuple[int, float]]]:
    """/generate ``meta_info`` asked with ``return_logprob`` and ``top_logprobs_num`` -> per
    generated token [(id, logprob)] best first. SGLang (tokenizer_manager.py
    detokenize_top_logprobs_tokens): ``output_top_logprobs`` is one list of [logprob, token_id,
    text or null] per token, None where a position has none."""
    field_name = "meta_info.output_top_logprobs"
    positions = meta.get("output_top_logprobs")
    if not isinstance(positions, list):
        raise SpecregError(f"{url}: the answer has no {field_name} (the server sent no log-probabilities)")
    tops = []
    for i, entry in enumerate(positions):
        pairs = []
        for item in seq(entry, f"{field_name}[{i}]", url):
            if not isinstance(item, list) or len(item) < 2:
                raise SpecregError(f"{url}: {field_name} has {_shown(item)}, not [[logprob, token_id, text], ...]")
            pairs.append((count(item[1], f"{field_name}[{i}] token id", url),
                          number(item[0], f"{field_name}[{i}] logprob", url)))
        tops.append(sorted(pairs, key=lambda pair: -pair[1]))
    return tops


def read_counters(engine: str, base_url: str, model_name: str | None = None) -> Counters | None:
    """The speculative-decoding counters of the engine's /metrics -> Counters; None for SGLang
    (its /metrics holds gauges over a window: its per-request meta_info is read instead)."""
    from specreg.registry.deploy.engines.vllm import read_metrics
    from specreg.registry.deploy.live_metrics import parse_samples

    if engine == "sglang":
        return None
    url = f"{base_url}/metrics"
    text = http_text(url)
    if engine == "llamacpp":
        # llama-server's names are vLLM's under the llamacpp: prefix, without model labels
        text = text.replace("llamacpp:spec_decode_", "vllm:spec_decode_")
    totals = read_metrics(parse_samples(text, url), model_name, url)
    # a counter is a whole number of events: NaN, a negative or a fraction is no engine's count
    per_position = {}
    for position, value in dict(totals["accepted_per_position"]).items():
        if isinstance(position, bool) or not isinstance(position, int) or not 0 <= position < 4096:
            raise SpecregError(f"{url}: accepted_per_pos position {_shown(position)} is not a position")
        per_position[position] = float(count(value, f"accepted_per_pos{{position=\"{position}\"}}", url))
    return Counters(*(float(count(totals[key], f"spec_decode {key}", url))
                      for key in ("drafts", "draft_tokens", "accepted_tokens")), per_position)


def run_concurrently(task: Callable[[Any], Any], items: list, concurrency: int) -> tuple[list, float]:
    """``task(item)`` for every item with ``concurrency`` requests in flight -> (results in
    item order, wall seconds from the first request to the last answer)."""
    started = time.perf_counter()
    if concurrency <= 1:
        results = [task(item) for item in items]
    else:
        pool = ThreadPoolExecutor(max_workers=concurrency)
        try:
            results = list(pool.map(task, items))
        except BaseException:
            # Ctrl-C or a failed request: do not wait for the requests still queued
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown()
    return results, time.perf_counter() - started


def server_identity(engine: str, base_url: str, timeout: float = 30.0) -> dict[str, Any]:
    """What the engine at ``base_url`` says it is: {"version", "build", "model"} (None where it
    does not say; each a string of at most 200 characters). llama.cpp: /props build_info; vLLM:
    /version; SGLang: /get_server_info. ``timeout``: each call, whole."""
    try:
        if engine == "llamacpp":
            url = f"{base_url}/props"
            props = http_json(url, timeout=timeout)
            slots = props.get("total_slots")
            return {"version": None, "build": label(props.get("build_info")), "model": label(props.get("model_path")),
                    "slots": count(slots, "total_slots", url) if slots is not None else None}
        if engine == "vllm":
            version = label(http_json(f"{base_url}/version", timeout=timeout).get("version"))
            url = f"{base_url}/v1/models"
            models = seq(http_json(url, timeout=timeout).get("data"), "data", url)
            first = obj(models[0], "data[0]", url) if models else {}
            return {"version": version, "build": f"vllm {version}", "model": label(first.get("id"))}
        info = http_json(f"{base_url}/get_server_info", timeout=timeout)
        version = label(info.get("version"))
        return {"version": version, "build": f"sglang {version}", "model": label(info.get("model_path"))}
    except SpecregError as exc:
        raise SpecregError(f"{engine} at {base_url}: cannot read its identity ({exc})") from None


def label(value: Any) -> str | None:
    """A name the engine gives itself, as one printable line of at most 200 characters (None: none)."""
    if value is None:
        return None
    text = value if isinstance(value, str) else json.dumps(value)
    return "".join(ch if ch.isprintable() else "?" for ch in " ".join(text.split()))[:200]

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
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise UsageError(f"engine URL {url!r} must be http://HOST:PORT or https://HOST:PORT")
    return url.rstrip("/")


def http_json(url: str, body: dict | None = None, timeout: float = 600.0) -> Any:
    """GET (body None) or POST JSON -> the decoded JSON answer. Errors -> SpecregError naming the URL
    and, for an HTTP error, the engine's own message."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read(MAX_BODY_BYTES + 1)
    except urllib.error.HTTPError as exc:
        detail = exc.read(2000).decode("utf-8", "replace").strip()
        raise SpecregError(f"{url} answered HTTP {exc.code}: {' '.join(detail.split())[:300]}") from None
    except urllib.error.URLError as exc:
        raise SpecregError(f"cannot reach {url}: {exc.reason}") from None
    except (TimeoutError, OSError) as exc:
        raise SpecregError(f"cannot read {url}: {exc}") from None
    if len(raw) > MAX_BODY_BYTES:
        raise SpecregError(f"{url} sent more than {MAX_BODY_BYTES} bytes")
    try:
        return json.loads(raw)
    except ValueError:
        raise SpecregError(f"{url} did not answer JSON: {raw[:120]!r}") from None


def http_text(url: str, timeout: float = 30.0) -> str:
    from specreg.registry.deploy.observe import scrape

    return scrape(url, timeout)


def complete(engine: str, base_url: str, prompt_ids: list[int], max_tokens: int, *, model: str | None = None,
             top_logprobs: int = 0, timeout: float = 600.0) -> EngineCompletion:
    """One greedy completion of ``prompt_ids`` (token ids, sent as ids: no re-tokenization) by
    the engine at ``base_url`` -> EngineCompletion. ``top_logprobs``: also return the engine's
    top-n log-probabilities of every generated position (the near-tie evidence)."""
    started = time.perf_counter()
    if engine == "llamacpp":
        body = {"prompt": list(prompt_ids), "max_tokens": max_tokens, "temperature": 0.0, "cache_prompt": False,
                "return_tokens": True, "verbose": True, "stream": False}
        if top_logprobs:
            body["n_probs"] = top_logprobs
        answer = http_json(f"{base_url}/v1/completions", body, timeout)
        seconds = time.perf_counter() - started
        verbose = answer.get("__verbose") or {}
        timings = answer.get("timings") or {}
        choice = (answer.get("choices") or [{}])[0]
        probabilities = None
        if top_logprobs:
            # server-task.cpp probs_vector_to_json: per token "top_logprobs" [{"id", "logprob"}] (the
            # target's softmax before sampling, n_probs of them, best first)
            probabilities = [[(int(p["id"]), float(p["logprob"])) for p in entry.get("top_logprobs") or []]
                             for entry in verbose.get("completion_probabilities") or []]
        return EngineCompletion(
            token_ids=[int(t) for t in verbose.get("tokens") or []], finish_reason=choice.get("finish_reason"),
            seconds=seconds, drafted=int(timings.get("draft_n", 0)), accepted=int(timings.get("draft_n_accepted", 0)),
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
        choice = (answer.get("choices") or [{}])[0]
        spec = (answer.get("metrics") or {}).get("speculative_decoding")
        completion = EngineCompletion(token_ids=[int(t) for t in choice.get("token_ids") or []],
                                      finish_reason=choice.get("finish_reason"), seconds=seconds, raw_spec=spec,
                                      top_logprobs=vllm_top_logprobs(choice, url) if top_logprobs else None)
        if spec:
            histogram = [int(v) for v in spec.get("acceptance_histogram") or []]
            completion.drafted = int(spec["num_draft_tokens"])
            completion.accepted = int(spec["num_accepted_draft_tokens"])
            completion.draft_steps = int(spec["num_spec_steps"])
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
        meta = answer.get("meta_info") or {}
        finish = meta.get("finish_reason")
        completion = EngineCompletion(token_ids=[int(t) for t in answer.get("output_ids") or []],
                                      finish_reason=finish.get("type") if isinstance(finish, dict) else finish,
                                      seconds=seconds,
                                      raw_spec={key: value for key, value in meta.items() if key.startswith("spec_")
                                                or key == "completion_tokens"},
                                      top_logprobs=sglang_top_logprobs(meta, url) if top_logprobs else None)
        if meta.get("spec_verify_ct"):
            completion.draft_steps = int(meta["spec_verify_ct"])
            if "spec_num_proposed_drafts" in meta:
                completion.drafted = int(meta["spec_num_proposed_drafts"])
                completion.accepted = int(meta["spec_num_correct_drafts"])
            histogram = meta.get("spec_correct_drafts_histogram")
            if histogram:
                completion.accepted_per_position = [sum(histogram[i + 1:]) for i in range(len(histogram) - 1)]
        return completion
    raise UsageError(f"unknown engine {engine!r}: use one of {', '.join(ENGINES)}")


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
    for entry in positions:
        pairs = []
        for key, logprob in (entry or {}).items():
            prefix, _, number = str(key).partition(":")
            if prefix != "token_id" or not number.lstrip("-").isdigit():
                raise SpecregError(f"{url}: {field_name} has the key {key!r}, not 'token_id:N' "
                                   f"(return_tokens_as_token_ids not honoured)")
            pairs.append((int(number), float(logprob)))
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
    for entry in positions:
        try:
            pairs = [(int(item[1]), float(item[0])) for item in entry or []]
        except (TypeError, ValueError, IndexError):
            raise SpecregError(f"{url}: {field_name} has {str(entry)[:80]}, not [[logprob, token_id, text], ...]") from None
        tops.append(sorted(pairs, key=lambda pair: -pair[1]))
    return tops


def read_counters(engine: str, base_url: str, model_name: str | None = None) -> Counters | None:
    """The speculative-decoding counters of the engine's /metrics -> Counters; None for SGLang
    (its /metrics holds gauges over a window: its per-request meta_info is read instead)."""
    from specreg.registry.deploy.engines.vllm import read_metrics
    from specreg.registry.deploy.observe import parse_samples

    if engine == "sglang":
        return None
    url = f"{base_url}/metrics"
    text = http_text(url)
    if engine == "llamacpp":
        # llama-server's names are vLLM's under the llamacpp: prefix, without model labels
        text = text.replace("llamacpp:spec_decode_", "vllm:spec_decode_")
    totals = read_metrics(parse_samples(text, url), model_name, url)
    return Counters(totals["drafts"], totals["draft_tokens"], totals["accepted_tokens"],
                    dict(totals["accepted_per_position"]))


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


def server_identity(engine: str, base_url: str) -> dict[str, Any]:
    """What the engine at ``base_url`` says it is: {"version", "build", "model"} (None where it
    does not say). llama.cpp: /props build_info; vLLM: /version; SGLang: /get_server_info."""
    try:
        if engine == "llamacpp":
            props = http_json(f"{base_url}/props", timeout=30)
            return {"version": None, "build": props.get("build_info"), "model": props.get("model_path"),
                    "slots": props.get("total_slots")}
        if engine == "vllm":
            version = http_json(f"{base_url}/version", timeout=30).get("version")
            models = http_json(f"{base_url}/v1/models", timeout=30).get("data") or [{}]
            return {"version": version, "build": f"vllm {version}", "model": models[0].get("id")}
        info = http_json(f"{base_url}/get_server_info", timeout=30)
        return {"version": info.get("version"), "build": f"sglang {info.get('version')}",
                "model": info.get("model_path")}
    except SpecregError as exc:
        raise SpecregError(f"{engine} at {base_url}: cannot read its identity ({exc})") from None

"""A loopback HTTP server whose speculative-decoding figures come from vLLM 0.33.0's own code.

Run with the unpacked vLLM wheel and its dependencies first on sys.path (engine_env). It
answers ``/v1/completions`` (token-id prompts, ``return_token_ids``), ``/metrics``, ``/version``
and ``/v1/models`` as ``vllm serve`` does. What it generates is scripted (SCHEDULE below, no
model), but every figure specreg reads is made by vLLM's code: each verify step goes through
``SpecDecodingStats.observe_draft`` into ``SpecDecodingProm`` (the exposition text of /metrics is
prometheus_client's rendering of vLLM's counters, labels model_name/engine as vLLM sets them),
and, with ``--per-request``, through ``RequestSpecDecodeMetrics.observe`` / ``to_dict`` into the
response's ``metrics.speculative_decoding``.

The response itself is vLLM's: the request body is parsed by ``CompletionRequest``, each step's
tokens and their log-probabilities (the sampler's rows: sampled token first, then the top
``logprobs``) go through ``LogprobsProcessor.update_from_output`` into a ``RequestOutput``, and
``OpenAIServingCompletion.request_output_to_completion_response`` builds the JSON (``logprobs``
with ``token_id:N`` keys when the request sets ``return_tokens_as_token_ids``). The scripted
target (scripted_target.py) puts each emitted token first, a rival ``--margin`` logits below it
and a third token 3 below that; ``--swap-at P`` makes this server emit the rival at generated position P of
every prompt (a speculative server that parts from the target-only one there).

    python vllm_spec_server.py --plans '[[K, MODEL_NAME, (--per-request), (--margin M), (--swap-at P)], ...]'
    (one server per plan, forked after vLLM's import: scripted_target.serve_plans; prints each
    port, then serves; K 0: no speculation, a target-only reference server)
"""

from __future__ import annotations

import json
import sys
import threading
import time
from types import SimpleNamespace

import numpy as np
import prometheus_client

import vllm
from vllm.entrypoints.generate.base.protocol import RequestResponseMetadata
from vllm.entrypoints.openai.completion.protocol import CompletionRequest
from vllm.entrypoints.openai.completion.serving import OpenAIServingCompletion
from vllm.outputs import CompletionOutput, RequestOutput
from vllm.v1.engine import EngineCoreOutput
from vllm.v1.engine.logprobs import LogprobsProcessor
from vllm.v1.metrics.stats import RequestSpecDecodeMetrics
from vllm.v1.outputs import LogprobsLists
from vllm.v1.spec_decode.metrics import SpecDecodingProm, SpecDecodingStats

from scripted_target import generation, option, serve, serve_plans, target_top


def sampler_rows(emitted: list[int], targets: list[int], margin: float, num_logprobs: int) -> LogprobsLists:
    """One step's rows as vLLM's sampler hands them on: per emitted token [sampled, top-1 ..
    top-num_logprobs] ids and log-probabilities, and the sampled token's rank."""
    ids, logprobs, ranks = [], [], []
    for token, target in zip(emitted, targets):
        top_ids, top_logprobs = target_top(target, margin)
        width = len(top_ids) if num_logprobs == -1 else min(num_logprobs, len(top_ids))
        rank = top_ids.index(token)
        ids.append([token, *top_ids[:width]])
        logprobs.append([top_logprobs[rank], *top_logprobs[:width]])
        ranks.append(rank + 1)
    return LogprobsLists(np.array(ids), np.array(logprobs, dtype=np.float32), np.array(ranks))


def main() -> int:
    k, model = int(sys.argv[1]), sys.argv[2]
    per_request = "--per-request" in sys.argv
    margin, swap_at = option("--margin", 4.0), int(option("--swap-at", -1))
    prom = SpecDecodingProm(SimpleNamespace(num_speculative_tokens=max(k, 1)), ["model_name", "engine"],
                            {0: [model, "0"]})
    lock = threading.Lock()
    # vLLM's response builder with the settings of a plain `vllm serve`; no engine behind it
    serving = object.__new__(OpenAIServingCompletion)
    serving.return_tokens_as_token_ids = False
    serving.enable_prompt_tokens_details = False
    serving.enable_per_request_metrics = False
    serving.system_fingerprint = None

    def get(path):
        if path == "/metrics":
            return 200, prometheus_client.generate_latest(), "text/plain; version=0.0.4"
        if path == "/version":
            return 200, json.dumps({"version": vllm.__version__}).encode(), "application/json"
        if path == "/v1/models":
            return 200, json.dumps({"data": [{"id": model}]}).encode(), "application/json"
        return None

    def post(body):
        request = CompletionRequest.model_validate(body)
        params = request.to_sampling_params(request.max_tokens)
        tokens, targets, steps = generation(request.prompt, request.max_tokens, k, swap_at)
        processor = LogprobsProcessor.from_new_request(None, SimpleNamespace(sampling_params=params))
        stats = SpecDecodingStats.new(max(k, 1))
        per = RequestSpecDecodeMetrics.new(max(k, 1))
        for step, accepted in steps:
            if processor.logprobs is not None:
                processor.update_from_output(EngineCoreOutput(
                    "cmpl-1", tokens[step], new_logprobs=sampler_rows(tokens[step], targets[step], margin,
                                                                      processor.num_logprobs)))
            if k:
                stats.observe_draft(num_draft_tokens=k, num_accepted_tokens=accepted)
                per.observe(num_draft_tokens=k, num_accepted=accepted)
        with lock:
            prom.observe(stats)
        output = CompletionOutput(index=0, text="", token_ids=tokens, cumulative_logprob=processor.cumulative_logprob,
                                  logprobs=processor.logprobs, finish_reason="length",
                                  spec_decode_metrics=per if per_request and k else None)
        final = RequestOutput("cmpl-1", None, list(request.prompt), None, [output], finished=True)
        response = serving.request_output_to_completion_response(
            [final], request, "cmpl-1", int(time.time()), model, None, RequestResponseMetadata(request_id="cmpl-1"))
        return response.model_dump()

    return serve(get, "/v1/completions", "prompt", post)


if __name__ == "__main__":
    sys.exit(serve_plans(main))

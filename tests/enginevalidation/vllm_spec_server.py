"""A loopback HTTP server whose speculative-decoding figures come from vLLM 0.33.0's own code.

Run with the unpacked vLLM wheel and its dependencies first on sys.path (engine_env). It
answers ``/v1/completions`` (token-id prompts, ``return_token_ids``), ``/metrics``, ``/version``
and ``/v1/models`` as ``vllm serve`` does. What it generates is scripted (SCHEDULE below, no
model), but every figure specreg reads is made by vLLM's code: each verify step goes through
``SpecDecodingStats.observe_draft`` into ``SpecDecodingProm`` (the exposition text of /metrics is
prometheus_client's rendering of vLLM's counters, labels model_name/engine as vLLM sets them),
and, with ``--per-request``, through ``RequestSpecDecodeMetrics.observe`` / ``to_dict`` into the
response's ``metrics.speculative_decoding``.

    python vllm_spec_server.py K MODEL_NAME [--per-request]   (prints the port, then serves)
"""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import prometheus_client

import vllm
from vllm.v1.metrics.stats import RequestSpecDecodeMetrics
from vllm.v1.spec_decode.metrics import SpecDecodingProm, SpecDecodingStats


def schedule(prompt_ids: list[int], max_tokens: int, k: int) -> tuple[list[int], list[int]]:
    """The scripted generation: step s accepts (len(prompt) + s) % (k + 1) of its k drafts and
    emits them plus one token. -> (token ids, accepted per step)."""
    tokens, accepted = [], []
    step = 0
    while len(tokens) < max_tokens:
        j = (len(prompt_ids) + step) % (k + 1)
        accepted.append(j)
        tokens += [(prompt_ids[-1] + len(tokens) + i) % 97 + 3 for i in range(j + 1)]
        step += 1
    return tokens[:max_tokens], accepted


def main() -> int:
    k, model = int(sys.argv[1]), sys.argv[2]
    per_request = "--per-request" in sys.argv
    prom = SpecDecodingProm(SimpleNamespace(num_speculative_tokens=k), ["model_name", "engine"], {0: [model, "0"]})
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def _send(self, status: int, body: bytes, kind: str = "application/json"):
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path == "/metrics":
                self._send(200, prometheus_client.generate_latest(), "text/plain; version=0.0.4")
            elif self.path == "/version":
                self._send(200, json.dumps({"version": vllm.__version__}).encode())
            elif self.path == "/v1/models":
                self._send(200, json.dumps({"data": [{"id": model}]}).encode())
            else:
                self._send(404, b"{}")

        def do_POST(self):
            request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path != "/v1/completions" or not isinstance(request.get("prompt"), list):
                self._send(400, json.dumps({"error": "token-id prompts only"}).encode())
                return
            tokens, accepted = schedule(request["prompt"], int(request["max_tokens"]), k)
            stats = SpecDecodingStats.new(k)
            per = RequestSpecDecodeMetrics.new(k)
            for j in accepted:
                stats.observe_draft(num_draft_tokens=k, num_accepted_tokens=j)
                per.observe(num_draft_tokens=k, num_accepted=j)
            with lock:
                prom.observe(stats)
            answer = {"id": "cmpl-1", "object": "text_completion", "model": model,
                      "choices": [{"index": 0, "text": "", "token_ids": tokens, "finish_reason": "length"}]}
            if per_request:
                answer["metrics"] = {"speculative_decoding": per.to_dict()}
            self._send(200, json.dumps(answer).encode())

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(server.server_address[1], flush=True)
    server.serve_forever(0.05)
    return 0


if __name__ == "__main__":
    sys.exit(main())

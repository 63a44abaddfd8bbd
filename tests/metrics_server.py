"""A real Prometheus endpoint for tests: an HTTP server on 127.0.0.1 serving metrics made
with prometheus_client under the engines' exact names (shared by tests/observe and the
end-to-end CLI tests)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, Counter, generate_latest


class MetricsServer:
    """A real HTTP endpoint; ``body`` is a callable producing the current response."""

    def __init__(self):
        self.body = lambda: b""
        self.status = 200
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                data = owner.body()
                self.send_response(owner.status)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):  # keep test output quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class FakeVllm:
    """vLLM's spec-decode counters in a private registry (prometheus_client adds `_total`)."""

    def __init__(self, with_accepted: bool = True):
        self.registry = CollectorRegistry()
        labels = ["model_name", "engine"]
        self.drafts = Counter("vllm:spec_decode_num_drafts", "drafts", labels, registry=self.registry)
        self.draft_tokens = Counter("vllm:spec_decode_num_draft_tokens", "draft tokens", labels, registry=self.registry)
        self.accepted = (Counter("vllm:spec_decode_num_accepted_tokens", "accepted", labels, registry=self.registry)
                         if with_accepted else None)
        self.per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos", "per position",
                               labels + ["position"], registry=self.registry)

    def step(self, model: str, drafts: int, k: int, accepted_per_pos: list[int], engine: str = "0"):
        """``drafts`` drafts of ``k`` tokens; accepted_per_pos[i] of them accepted position i."""
        self.drafts.labels(model, engine).inc(drafts)
        self.draft_tokens.labels(model, engine).inc(drafts * k)
        if self.accepted is not None:
            self.accepted.labels(model, engine).inc(sum(accepted_per_pos))
        for position, count in enumerate(accepted_per_pos):
            self.per_pos.labels(model, engine, str(position)).inc(count)

    def body(self) -> bytes:
        return generate_latest(self.registry)

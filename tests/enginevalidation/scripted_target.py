"""The scripted generation the loopback engine servers (vllm_spec_server.py,
sglang_spec_server.py) serve instead of a model: which tokens, how many drafts each verify step
accepts, and the target's top log-probabilities at each position. No engine code here: the
servers hand these numbers to the engines' own code, which builds every figure specreg reads."""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import traceback


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


def rival(token: int) -> int:
    """The scripted target's second choice after ``token`` (another id of the same 3..99 range)."""
    return (token - 2) % 97 + 3


def target_top(token: int, margin: float) -> tuple[list[int], list[float]]:
    """The scripted target at a position whose top-1 is ``token`` -> (ids, log-probabilities), best first."""
    ids = [token, rival(token), rival(rival(token))]
    logits = [0.0, -margin, -margin - 3.0]
    norm = math.log(sum(math.exp(logit) for logit in logits))
    return ids, [logit - norm for logit in logits]


def generation(prompt_ids: list[int], max_tokens: int, k: int,
               swap_at: int) -> tuple[list[int], list[int], list[tuple[slice, int]]]:
    """One request: (emitted tokens, the target's top-1 at each position, per verify step the
    positions it emits and the drafts it accepted). k 0: a target-only server, one token a step.
    The rival is emitted at position ``swap_at`` (-1: never)."""
    targets, accepted = schedule(prompt_ids, max_tokens, max(k, 1))
    tokens = [rival(t) if i == swap_at else t for i, t in enumerate(targets)]
    if k == 0:
        accepted = [0] * len(targets)
    steps, start = [], 0
    for j in accepted:
        steps.append((slice(start, min(start + j + 1, len(tokens))), j))
        start += j + 1
    return tokens, targets, steps


def option(name: str, default: float) -> float:
    return float(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default


def serve(get, post_path: str, prompt_field: str, post) -> int:
    """Serve on a free loopback port, printed first (the test reads it): GET PATH -> get(PATH),
    (status, body bytes, content type) or None for 404; POST ``post_path`` whose JSON body has a
    token-id list in ``prompt_field`` -> post(body), sent as JSON; any other POST -> 400."""
    import json
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def _send(self, status: int, body: bytes, kind: str = "application/json"):
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            answer = get(self.path)
            self._send(*answer) if answer is not None else self._send(404, b"{}")

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path != post_path or not isinstance(body.get(prompt_field), list):
                self._send(400, json.dumps({"error": "token-id prompts only"}).encode())
                return
            self._send(200, json.dumps(post(body)).encode())

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(server.server_address[1], flush=True)
    server.serve_forever(0.05)
    return 0


def serve_plans(main) -> int:
    """Run ``main`` once per plan of ``--plans JSON`` (a list of argument lists: what each server's
    command line would be), each in a process of its own forked after the engine's import, the
    slow part (20-30 CPU-seconds for vLLM or SGLang, paid once instead of once per server).
    After the fork the servers share nothing: each has its own counters, state and port. Prints
    each plan's port in plan order, one a line; SIGTERM stops every server. A server that dies
    before its port stops the others and exits 1 (its traceback on stderr)."""
    plans = json.loads(sys.argv[sys.argv.index("--plans") + 1])
    children: list[int] = []

    def stop(code: int) -> None:
        for pid in children:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for pid in children:
            os.waitpid(pid, 0)
        os._exit(code)

    signal.signal(signal.SIGTERM, lambda *_: stop(0))
    for plan in plans:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.close(read)
            os.dup2(write, 1)  # its port line to this process, which prints the ports in plan order
            os.close(write)
            sys.argv = [sys.argv[0], *plan]
            code = 1
            try:
                code = main()
            except BaseException:  # noqa: BLE001 - printed as the server process would die of it
                traceback.print_exc()
            os._exit(code)
        children.append(pid)
        os.close(write)
        with os.fdopen(read) as lines:
            port = lines.readline().strip()
        if not port.isdigit():
            print(f"{sys.argv[0]}: the server of plan {plan} exited before serving", file=sys.stderr, flush=True)
            stop(1)
        print(port, flush=True)
    while True:
        signal.pause()

"""`observe` against hostile or broken metrics endpoints: a server
that trickles a byte a second, counters that claim more accepted than drafted tokens, position
labels that are not small integers. Each one is a one-line error or a flagged reading, never a
hang, an "ok" or a traceback."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from specreg.errors import SpecregError
from specreg.registry.deploy.live_metrics import compare_with_baseline, observe, scrape


class TrickleServer:
    """A real TCP server on 127.0.0.1 that answers each connection with ``head`` at once and then
    ``body`` one byte every ``pause`` seconds (a slowloris in reverse)."""

    def __init__(self, head: bytes, body: bytes, pause: float = 1.0):
        self.head, self.body, self.pause = head, body, pause
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/metrics"
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self):
        self.listener.settimeout(0.1)
        while not self.stop.is_set():
            try:
                connection, _ = self.listener.accept()
            except OSError:
                continue
            threading.Thread(target=self.trickle, args=(connection,), daemon=True).start()

    def trickle(self, connection):
        with connection:
            try:
                connection.recv(65536)
                connection.sendall(self.head)
                for byte in self.body:
                    if self.stop.wait(self.pause):
                        return
                    connection.sendall(bytes([byte]))
            except OSError:  # the client gave up: what the test wants
                pass

    def close(self):
        self.stop.set()
        self.listener.close()


BODY = b"# TYPE vllm:spec_decode_num_drafts counter\nvllm:spec_decode_num_drafts_total 1\n" * 50


@pytest.mark.parametrize("where", ["body", "headers"])
def test_a_server_sending_one_byte_a_second_is_cut_at_the_deadline(where):
    """MED-3: each byte comes within the per-read timeout, so only a total deadline ends the scrape."""
    response = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n" % len(BODY)
    head, body = (response, BODY) if where == "body" else (b"", response + BODY)
    server = TrickleServer(head, body, pause=0.5)
    try:
        started = time.monotonic()
        with pytest.raises(SpecregError, match=rf"metrics endpoint {server.url} did not send its whole answer "
                                               r"within 2 s"):
            scrape(server.url, timeout=1.0, deadline_s=2.0)
        assert time.monotonic() - started < 4.0
        with pytest.raises(SpecregError, match="within 1.5 s"):
            observe(server.url, "vllm", interval=1, sleep=lambda s: None, timeout=1.0, deadline_s=1.5)
    finally:
        server.close()


def test_a_whole_answer_within_the_deadline_is_read():
    response = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n" % len(BODY)
    server = TrickleServer(response + BODY, b"", pause=0.0)
    try:
        assert scrape(server.url, timeout=1.0, deadline_s=5.0) == BODY.decode()
    finally:
        server.close()


BASELINES = {"k": 4, "tau_definition": "engines",
             "overall": {"acceptance_rate": 0.71, "mean_acceptance_length": 3.1,
                         "per_position_acceptance": [0.9, 0.8, 0.7, 0.6]}}


@pytest.fixture
def server():
    from metrics_server import MetricsServer

    metrics_server = MetricsServer()
    yield metrics_server
    metrics_server.close()


def test_more_accepted_than_drafted_is_an_invalid_reading_not_ok(server):
    """MED-4: 4000 tokens accepted of 40 drafted (alpha 100) was called "ok" (100 >= the floor)."""
    from metrics_server import FakeVllm

    engine = FakeVllm()
    engine.step("chat-pair", 0, 4, [0, 0, 0, 0])
    server.body = engine.body
    live = observe(server.url, "vllm", interval=1, sleep=lambda s: engine.step("chat-pair", 10, 4, [1000] * 4))
    assert live["acceptance_rate"] == 100.0
    verdict = compare_with_baseline(live, BASELINES)
    assert (verdict["verdict"], verdict["exit_code"]) == ("invalid", 1)
    assert verdict["reasons"][0] == "invalid reading: 4000 tokens accepted but only 40 drafted in the interval"
    assert all(check["ok"] is None for check in verdict["checks"])


@pytest.mark.parametrize("live, problem", [
    ({"acceptance_rate": 100.0, "mean_acceptance_length": 3.0}, "acceptance_rate 100 is not a rate between 0 and 1"),
    ({"acceptance_rate": -0.5, "mean_acceptance_length": 3.0}, "acceptance_rate -0.5 is not a rate"),
    ({"acceptance_rate": float("nan"), "mean_acceptance_length": 3.0}, "acceptance_rate nan is not a rate"),
    ({"acceptance_rate": 0.7, "mean_acceptance_length": 0.0}, "mean_acceptance_length 0 is below 1"),
    ({"acceptance_rate": 0.7, "mean_acceptance_length": 9.0}, r"mean_acceptance_length 9 is above k \+ 1 = 5"),
    ({"acceptance_rate": 0.7, "mean_acceptance_length": 3.0, "per_position_acceptance": [0.5, 0.9]},
     "rises with the position"),
    ({"acceptance_rate": 0.7, "mean_acceptance_length": 3.0, "per_position_acceptance": [1.5]}, r"outside \[0, 1\]"),
])
def test_impossible_figures_are_invalid(live, problem):
    verdict = compare_with_baseline(live, BASELINES)
    assert verdict["verdict"] == "invalid" and verdict["exit_code"] == 1
    assert any(__import__("re").search(problem, reason) for reason in verdict["reasons"]), verdict["reasons"]


def test_sglang_gauge_of_100_is_invalid(server):
    from prometheus_client import CollectorRegistry, Gauge, generate_latest

    registry = CollectorRegistry()
    Gauge("sglang:spec_accept_length", "tau", ["model_name"], registry=registry).labels("p").set(3.0)
    Gauge("sglang:spec_accept_rate", "alpha", ["model_name"], registry=registry).labels("p").set(100)
    server.body = lambda: generate_latest(registry)
    verdict = compare_with_baseline(observe(server.url, "sglang", interval=1, sleep=lambda s: None), BASELINES)
    assert verdict["verdict"] == "invalid"


def test_a_baseline_recorded_before_engine_tau_is_compared_on_alpha_only():
    """A baseline without tau_definition holds tokens per target forward under mean_acceptance_length:
    comparing an engine's tau with it would hide a drop (the engine's tau is never lower), so tau is
    not compared, and the result says why."""
    legacy = {"k": 4, "overall": {"acceptance_rate": 0.71, "mean_acceptance_length": 1.45,
                                  "per_position_acceptance": [0.9, 0.8]}}
    # alpha 0.70 within 10% of 0.71; tau 2.0 would pass the legacy 1.45 * 0.9 floor although it is far
    # below what the engine showed at validation
    verdict = compare_with_baseline({"acceptance_rate": 0.70, "mean_acceptance_length": 2.0}, legacy)
    assert verdict["verdict"] == "ok"
    assert [check["metric"] for check in verdict["checks"]] == ["acceptance_rate"]
    assert verdict["not_compared"] and "recorded before tau was counted as the engines count it" in \
        verdict["not_compared"][0]


def test_tau_floor_applies_the_tolerance_to_the_accepted_part():
    """A 10% drop in accepted tokens per draft step is a 6.8% drop of tau 3.1: the floor is
    1 + (3.1 - 1) * 0.9 = 2.89, not 3.1 * 0.9 = 2.79."""
    verdict = compare_with_baseline({"acceptance_rate": 0.65, "mean_acceptance_length": 2.88}, BASELINES)
    tau = next(check for check in verdict["checks"] if check["metric"] == "mean_acceptance_length")
    assert tau["floor"] == pytest.approx(2.89) and tau["ok"] is False and verdict["verdict"] == "drift"


@pytest.mark.parametrize("label", ["²", "1" * 5000, "-1", "1.5", "", "٣", "1000"])
def test_position_labels_that_are_no_draft_position_are_one_line_errors(server, label):
    """MED-9: "²".isdigit() is true and int("²") raises; int() of 5000 digits raises past Python's
    4300-digit limit; both were tracebacks. vLLM labels positions 0..k-1 (str(pos))."""
    from metrics_server import FakeVllm

    engine = FakeVllm()
    engine.step("chat-pair", 5, 4, [4, 3, 2, 1])
    engine.per_pos.labels("chat-pair", "0", label).inc(1)
    server.body = engine.body
    with pytest.raises(SpecregError) as raised:
        observe(server.url, "vllm", interval=1, sleep=lambda s: None)
    message = str(raised.value)
    assert "\n" not in message and len(message) < 300
    assert f"{server.url}: vllm:spec_decode_num_accepted_tokens_per_pos_total has position label" in message

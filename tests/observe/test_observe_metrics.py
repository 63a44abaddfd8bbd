"""`observe` against a real HTTP server on 127.0.0.1 serving prometheus_client metrics under the
engines' exact names; the test's `sleep` advances the engine between the two scrapes."""

from __future__ import annotations

import socket

import pytest
from prometheus_client import CollectorRegistry, Gauge, generate_latest

from specreg.errors import SpecregError, UsageError
from specreg.registry.deploy.live_metrics import compare_with_baseline, observe
from metrics_server import FakeVllm, MetricsServer

BASELINES = {"golden_set": "default", "golden_sha256": "9" * 64, "validated_at": "2025-01-02T03:04:05+00:00",
             "k": 4, "tau_definition": "engines", "overall": {"acceptance_rate": 0.71, "mean_acceptance_length": 3.1,
                         "per_position_acceptance": [0.9, 0.8, 0.7, 0.6]},
             "per_category": {}}


@pytest.fixture
def server():
    metrics_server = MetricsServer()
    yield metrics_server
    metrics_server.close()


def test_vllm_healthy(server):
    engine = FakeVllm()
    engine.step("chat-pair", 50, 4, [40, 30, 20, 10])  # history before the interval
    server.body = engine.body
    slept = []

    def sleep(seconds):
        slept.append(seconds)
        # 100 drafts of 4: 300 of 400 tokens accepted -> alpha 0.75, tau 1 + 300/100 = 4.0
        engine.step("chat-pair", 60, 4, [60, 50, 40, 30], engine="0")
        engine.step("chat-pair", 40, 4, [35, 30, 30, 25], engine="1")

    live = observe(server.url, "vllm", interval=7, model_name="chat-pair", sleep=sleep)
    assert slept == [7]
    assert live["acceptance_rate"] == pytest.approx(0.75)
    assert live["mean_acceptance_length"] == pytest.approx(4.0)
    assert live["per_position_acceptance"] == pytest.approx([0.95, 0.8, 0.7, 0.55])
    assert (live["drafts"], live["draft_tokens"], live["accepted_tokens"]) == (100, 400, 300)
    assert live["url"] == server.url and live["engine"] == "vllm"
    verdict = compare_with_baseline(live, BASELINES, tolerance=0.1)
    assert verdict["verdict"] == "ok" and verdict["reasons"] == [] and verdict["exit_code"] == 0


def test_vllm_drift(server):
    engine = FakeVllm()
    engine.step("chat-pair", 0, 4, [0, 0, 0, 0])  # vLLM creates its labelled series at zero on start
    server.body = engine.body
    # 100 drafts of 4, 100 accepted: alpha 0.25 < 0.639, tau 2.0 < 1 + 2.1 * 0.9 = 2.89
    live = observe(server.url, "vllm", interval=1, sleep=lambda s: engine.step("chat-pair", 100, 4, [60, 30, 10, 0]))
    verdict = compare_with_baseline(live, BASELINES, tolerance=0.1)
    assert verdict["verdict"] == "drift" and verdict["exit_code"] == 100
    assert [check["metric"] for check in verdict["checks"] if not check["ok"]] == [
        "acceptance_rate", "mean_acceptance_length"]
    assert "acceptance_rate 0.2500 is below 0.6390" in verdict["reasons"][0]


def test_vllm_model_name_filter(server):
    engine = FakeVllm()
    engine.step("other-pair", 1, 4, [0, 0, 0, 0])
    engine.step("chat-pair", 1, 4, [1, 1, 1, 1])
    server.body = engine.body

    def sleep(_):
        engine.step("chat-pair", 10, 4, [10, 9, 8, 7])  # 34/40 = 0.85
        engine.step("other-pair", 10, 4, [1, 0, 0, 0])  # would drag the sum down

    live = observe(server.url, "vllm", interval=1, model_name="chat-pair", sleep=sleep)
    assert live["acceptance_rate"] == pytest.approx(0.85)
    with pytest.raises(SpecregError, match=r"not for model_name='nobody' \(seen: chat-pair, other-pair\)"):
        observe(server.url, "vllm", interval=1, model_name="nobody", sleep=lambda s: None)


def test_vllm_no_traffic_is_no_data(server):
    engine = FakeVllm()
    engine.step("chat-pair", 5, 4, [5, 5, 5, 5])
    server.body = engine.body
    live = observe(server.url, "vllm", interval=1, sleep=lambda s: None)
    assert live["acceptance_rate"] is None and live["mean_acceptance_length"] is None
    verdict = compare_with_baseline(live, BASELINES)
    assert verdict["verdict"] == "no-data" and verdict["exit_code"] == 1


def test_vllm_counter_reset_is_an_error(server):
    engines = [FakeVllm(), FakeVllm()]
    engines[0].step("chat-pair", 50, 4, [40, 30, 20, 10])
    engines[1].step("chat-pair", 5, 4, [4, 3, 2, 1])
    current = {"engine": engines[0]}
    server.body = lambda: current["engine"].body()
    with pytest.raises(SpecregError, match="went backwards"):
        observe(server.url, "vllm", interval=1, sleep=lambda s: current.update(engine=engines[1]))


def test_missing_metric_is_named(server):
    engine = FakeVllm(with_accepted=False)
    engine.step("chat-pair", 5, 4, [4, 3, 2, 1])
    server.body = engine.body
    with pytest.raises(SpecregError, match=f"{server.url} has no metric vllm:spec_decode_num_accepted_tokens_total"):
        observe(server.url, "vllm", interval=1, sleep=lambda s: None)


def test_sglang_gauges_healthy_and_drift(server):
    registry = CollectorRegistry()
    length = Gauge("sglang:spec_accept_length", "tau", ["model_name"], registry=registry)
    rate = Gauge("sglang:spec_accept_rate", "alpha", ["model_name"], registry=registry)
    length.labels("chat-pair").set(3.3)
    rate.labels("chat-pair").set(0.74)
    server.body = lambda: generate_latest(registry)

    def sleep(_):
        length.labels("chat-pair").set(3.1)
        rate.labels("chat-pair").set(0.70)

    live = observe(server.url, "sglang", interval=1, model_name="chat-pair", sleep=sleep)
    assert live["mean_acceptance_length"] == pytest.approx(3.2)
    assert live["acceptance_rate"] == pytest.approx(0.72)
    assert compare_with_baseline(live, BASELINES)["verdict"] == "ok"

    def collapse(_):
        length.labels("chat-pair").set(1.2)
        rate.labels("chat-pair").set(0.1)

    live = observe(server.url, "sglang", interval=1, model_name="chat-pair", sleep=collapse)
    verdict = compare_with_baseline(live, BASELINES)
    assert verdict["verdict"] == "drift" and len(verdict["reasons"]) == 2
    server.body = lambda: b"# TYPE other gauge\nother 1\n"
    with pytest.raises(SpecregError, match="has no metric sglang:spec_accept_length"):
        observe(server.url, "sglang", interval=1, sleep=lambda s: None)


@pytest.mark.parametrize("body", [b"<html><body>Not Found</body></html>", b'{"status": "ok"}', b"hello world\n"])
def test_garbage_body(server, body):
    server.body = lambda: body
    with pytest.raises(SpecregError, match=f"{server.url} did not return Prometheus text format"):
        observe(server.url, "vllm", interval=1, sleep=lambda s: None)


def test_http_error_names_url(server):
    server.status = 503
    with pytest.raises(SpecregError, match=f"metrics endpoint {server.url} answered HTTP 503"):
        observe(server.url, "vllm", interval=1, sleep=lambda s: None)


def test_connection_refused_names_url():
    with socket.socket() as probe:  # a port that was free a moment ago and has no listener now
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}/metrics"
    with pytest.raises(SpecregError, match=f"cannot reach metrics endpoint {url}"):
        observe(url, "vllm", interval=1, sleep=lambda s: None, timeout=2)


def test_engine_and_arguments_refused():
    with pytest.raises(UsageError, match="trtllm is not supported"):
        observe("http://127.0.0.1:1/metrics", "trtllm", sleep=lambda s: None)
    with pytest.raises(UsageError, match="must be http"):
        observe("file:///etc/passwd", "vllm", sleep=lambda s: None)
    with pytest.raises(SpecregError, match="no recorded acceptance baseline"):
        compare_with_baseline({"acceptance_rate": 0.5}, None)

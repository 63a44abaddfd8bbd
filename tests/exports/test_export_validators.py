"""The exported alert rules and manifest checked by the tools their consumers use:
``promtool check rules`` / ``promtool test rules`` (Debian package prometheus) with series where
each alert must fire and where it must not, and ``kubernetes-validate --strict``.

Skipped when a tool is not installed, a failure with CI=true (.ci/run installs both)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from specreg.registry.deploy.exports import render_export

from helpers import in_ci  # tests/ is on sys.path (tests/conftest.py)

RULES_OPTIONS = {"tolerance": 0.1, "for": "10m", "rate_window": "5m"}
# Baselines (exportcase.BASELINES): alpha 0.71, tau 3.1 -> floors 0.639 and 1 + 2.1 * 0.9 = 2.89.
RATE_ALERT, LENGTH_ALERT = "SpecDecodeAcceptanceRateBelowBaseline", "SpecDecodeAcceptanceLengthBelowBaseline"


def tool(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if found:
        return found
    if in_ci():
        pytest.fail(f"{name} is not installed in CI (.ci/run installs it)")
    pytest.skip(f"{name} is not installed (apt-get install prometheus / pip install kubernetes-validate)")


def vllm_counters(model_name: str, drafts_per_min: int, draft_tokens_per_min: int, accepted_per_min: int) -> list[dict]:
    labels = f'{{model_name="{model_name}",engine="0"}}'
    return [
        {"series": f"vllm:spec_decode_num_drafts_total{labels}", "values": f"0+{drafts_per_min}x40"},
        {"series": f"vllm:spec_decode_num_draft_tokens_total{labels}", "values": f"0+{draft_tokens_per_min}x40"},
        {"series": f"vllm:spec_decode_num_accepted_tokens_total{labels}", "values": f"0+{accepted_per_min}x40"},
    ]


def sglang_gauges(model_name: str, accept_rate: float, accept_length: float) -> list[dict]:
    labels = f'{{model_name="{model_name}"}}'
    return [
        {"series": f"sglang:spec_accept_rate{labels}", "values": f"{accept_rate}x40"},
        {"series": f"sglang:spec_accept_length{labels}", "values": f"{accept_length}x40"},
    ]


def expected(rules: list[dict], alert: str, engines: tuple[str, ...]) -> list[dict]:
    return [{"exp_labels": rule["labels"], "exp_annotations": rule["annotations"]}
            for rule in rules if rule["alert"] == alert and rule["labels"]["engine"] in engines]


def test_promtool_checks_rules_and_alerts_fire_only_below_the_floor(draft_pair, baselines, tmp_path):
    promtool = tool("promtool")
    text = dict(render_export(draft_pair, baselines, "prometheus-rules", approved=True,
                              options=RULES_OPTIONS))["prometheus-rules.yaml"]
    (tmp_path / "rules.yaml").write_text(text)
    checked = subprocess.run([promtool, "check", "rules", "rules.yaml"], cwd=tmp_path, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 4 rules found" in checked.stdout

    rules = yaml.safe_load(text)["groups"][0]["rules"]
    scenarios = [
        # (series, {alert: engines expected to fire at 20m})
        # Healthy: alpha 300/400 = 0.75, tau 1 + 300/100 = 4.0; SGLang 0.8 / 3.5.
        (vllm_counters("chat-pair", 100, 400, 300) + sglang_gauges("chat-pair", 0.8, 3.5), {}),
        # alpha 200/400 = 0.5 < 0.639 but tau 1 + 200/100 = 3.0 >= 2.89: only the rate alert.
        (vllm_counters("chat-pair", 100, 400, 200), {RATE_ALERT: ("vllm",)}),
        # alpha 0.25, tau 2.0: both, on vLLM; SGLang below both floors too.
        (vllm_counters("chat-pair", 100, 400, 100) + sglang_gauges("chat-pair", 0.5, 2.0),
         {RATE_ALERT: ("vllm", "sglang"), LENGTH_ALERT: ("vllm", "sglang")}),
        # Another model's collapse is not this pair's: the model_name selector holds.
        (vllm_counters("other-model", 100, 400, 10) + sglang_gauges("other-model", 0.1, 1.1), {}),
        # An idle server (no drafts): the vLLM ratios are NaN and nothing fires.
        (vllm_counters("chat-pair", 0, 0, 0), {}),
    ]
    tests = []
    for series, firing in scenarios:
        alert_tests = []
        for alert in (RATE_ALERT, LENGTH_ALERT):
            # At 8m the condition has held for less than `for: 10m`: nothing fires yet.
            alert_tests.append({"eval_time": "8m", "alertname": alert, "exp_alerts": []})
            alert_tests.append({"eval_time": "25m", "alertname": alert,
                                "exp_alerts": expected(rules, alert, firing.get(alert, ()))})
        tests.append({"interval": "1m", "input_series": series, "alert_rule_test": alert_tests})
    (tmp_path / "rules-test.yaml").write_text(yaml.safe_dump(
        {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests}, sort_keys=False))
    tested = subprocess.run([promtool, "test", "rules", "rules-test.yaml"], cwd=tmp_path, capture_output=True, text=True)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_promtool_test_fails_when_an_expected_alert_is_missing(draft_pair, baselines, tmp_path):
    """The harness can fail: expecting silence from a collapsed pair is an error."""
    promtool = tool("promtool")
    text = dict(render_export(draft_pair, baselines, "prometheus-rules", approved=True,
                              options=RULES_OPTIONS))["prometheus-rules.yaml"]
    (tmp_path / "rules.yaml").write_text(text)
    test = {"interval": "1m", "input_series": vllm_counters("chat-pair", 100, 400, 100),
            "alert_rule_test": [{"eval_time": "25m", "alertname": RATE_ALERT, "exp_alerts": []}]}
    (tmp_path / "t.yaml").write_text(yaml.safe_dump({"rule_files": ["rules.yaml"], "tests": [test]}))
    tested = subprocess.run([promtool, "test", "rules", "t.yaml"], cwd=tmp_path, capture_output=True, text=True)
    assert tested.returncode != 0 and RATE_ALERT in tested.stdout + tested.stderr


@pytest.mark.parametrize("volume", ["pvc:llm-models", "hostPath:/srv/models"])
@pytest.mark.parametrize("method", ["draft", "ngram"])
def test_kubernetes_validate_strict(volume, method, draft_pair, ngram_pair, baselines, tmp_path):
    validate = tool("kubernetes-validate")
    pair = draft_pair if method == "draft" else ngram_pair
    text = dict(render_export(pair, baselines, "k8s-vllm", approved=True,
                              options={"model_volume": volume, "namespace": "serving"}))["k8s-vllm.yaml"]
    (tmp_path / "k8s.yaml").write_text(text)
    result = subprocess.run([validate, "--strict", "k8s.yaml"], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "passed for resource deployment/chat-pair-v3" in result.stdout
    assert "passed for resource service/chat-pair-v3" in result.stdout
    assert "passed for resource configmap/chat-pair-v3-engine" in result.stdout  # the engine's arguments


def test_kubernetes_validate_strict_rejects_an_unknown_field(draft_pair, baselines, tmp_path):
    """The validator can fail: a misspelt field in the same manifest is refused."""
    validate = tool("kubernetes-validate")
    text = dict(render_export(draft_pair, baselines, "k8s-vllm", approved=True,
                              options={"model_volume": "pvc:m"}))["k8s-vllm.yaml"]
    (tmp_path / "k8s.yaml").write_text(text.replace("readOnly: true", "readOnlyy: true", 1))
    result = subprocess.run([validate, "--strict", "k8s.yaml"], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode != 0

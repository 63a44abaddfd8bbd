"""`specreg export --format argo-analysis`: the Argo Rollouts AnalysisTemplate, checked at two
levels against Argo Rollouts 1.9 and by promtool:

- the released CRD's openAPIV3Schema (templates/engines/argo-rollouts-1.9.json, from
  manifests/crds/analysis-template-crd.yaml of v1.9.1 by scripts/argo_schema.py), with unknown
  fields refused as `kubectl apply --validate=strict` refuses them;
- the controller's metric rules, as utils/analysis/factory.go ValidateMetrics states them;
- promtool evaluating each query on canary series 9.5 % and 10.5 % below the baseline (of the
  acceptance rate, and of tau's accepted part, tau - 1, as the floors are defined): the first
  passes the metric's successCondition, the second meets its failureCondition.
"""

from __future__ import annotations

import copy
import re
import subprocess

import jsonschema
import pytest
import yaml
from test_export_validators import tool

from specreg.errors import SpecregError, UsageError
from specreg.registry.deploy.engines import argo, llamacpp, sglang, vllm
from specreg.registry.deploy.exports import engine_schema, render_export

ENGINES = ("vllm", "sglang", "llamacpp")
# exportcase.BASELINES: alpha 0.71, tau 3.1 -> floors 0.639 and 1 + 2.1 * 0.9 = 2.89 (tolerance 0.1)
ALPHA, TAU, TOLERANCE = 0.71, 3.1, 0.1
CANARY, STABLE = "5f7d9c8b6", "77c4d5e6f"


def render(pair, baselines, **options) -> dict:
    files = dict(render_export(pair, baselines, "argo-analysis", approved=True, options=options))
    assert list(files) == ["argo-analysis.yaml"]
    return yaml.safe_load(files["argo-analysis.yaml"])


def strict(schema: dict) -> dict:
    """The schema with unknown fields refused wherever the CRD lists an object's fields (the API
    server's strict field validation; objects marked x-kubernetes-preserve-unknown-fields keep them)."""
    schema = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if "properties" in node and "additionalProperties" not in node \
                    and not node.get("x-kubernetes-preserve-unknown-fields"):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)
    walk(schema)
    return schema


GO_DURATION = re.compile(r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$")  # time.ParseDuration's units


def controller_errors(metrics: list[dict]) -> list[str]:
    """argo-rollouts v1.9.1 utils/analysis/factory.go ValidateMetrics / ValidateMetric, line by line."""
    errors, names = [], set()
    if not metrics:
        return ["no metrics specified"]
    for i, metric in enumerate(metrics):
        if metric["name"] in names:
            errors.append(f"metrics[{i}]: duplicate name")
        names.add(metric["name"])
        count, failure_limit = int(metric.get("count", 0)), int(metric.get("failureLimit", 0))
        success_limit, inconclusive_limit = (int(metric.get("consecutiveSuccessLimit", 0)),
                                             int(metric.get("inconclusiveLimit", 0)))
        if success_limit < 0 or failure_limit < -1 or inconclusive_limit < 0:
            errors.append(f"metrics[{i}]: negative limit")
        if count > 0 and failure_limit >= 0 and count < failure_limit + success_limit:
            errors.append(f"metrics[{i}]: count must be >= failureLimit + consecutiveSuccessLimit")
        if count > 0 and count < inconclusive_limit:
            errors.append(f"metrics[{i}]: count must be >= inconclusiveLimit")
        if count > 1 and not metric.get("interval"):
            errors.append(f"metrics[{i}]: interval must be specified when count > 1")
        if metric.get("interval") and not GO_DURATION.match(metric["interval"]):
            errors.append(f"metrics[{i}]: invalid interval string")
        if len(metric["provider"]) != 1:
            errors.append(f"metrics[{i}]: exactly one provider")
    return errors


def condition_holds(condition: str, result: list[float]) -> bool:
    """An Argo condition of the form the export writes, `result[0] OP NUMBER`, on a query result
    (a Prometheus vector's values); NaN compares false, as in Go."""
    match = re.fullmatch(r"result\[0\] (>=|<) ([0-9.]+)", condition)
    assert match, condition
    value, bound = result[0], float(match.group(2))
    return value >= bound if match.group(1) == ">=" else value < bound


# --- the released CRD's schema and the controller's rules ----------------------------------------

@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("method", ["draft", "ngram"])
def test_template_is_valid_for_argo_rollouts_1_9(engine, method, draft_pair, ngram_pair, baselines):
    schema_file = engine_schema("argo-rollouts")
    assert "argo-rollouts v1.9.1" in schema_file["source"]
    document = render(draft_pair if method == "draft" else ngram_pair, baselines, analysis_engine=engine,
                      namespace="serving")
    jsonschema.validate(document, strict(schema_file["openAPIV3Schema"]))
    assert (document["apiVersion"], document["kind"]) == ("argoproj.io/v1alpha1", "AnalysisTemplate")
    assert controller_errors(document["spec"]["metrics"]) == []
    assert document["spec"]["args"] == [{"name": "canary-hash"}]
    assert [m["name"] for m in document["spec"]["metrics"]] == ["acceptance-rate", "mean-acceptance-length"]
    for metric in document["spec"]["metrics"]:
        assert set(metric["provider"]) == {"prometheus"}
        assert "{{args.canary-hash}}" in metric["provider"]["prometheus"]["query"]


def test_the_checks_can_fail(draft_pair, baselines):
    """A misspelt field, a count below the failure limit, a second provider: each is refused."""
    schema = strict(engine_schema("argo-rollouts")["openAPIV3Schema"])
    document = render(draft_pair, baselines)
    misspelt = copy.deepcopy(document)
    misspelt["spec"]["metrics"][0]["successCondtion"] = misspelt["spec"]["metrics"][0].pop("successCondition")
    with pytest.raises(jsonschema.ValidationError, match="successCondtion"):
        jsonschema.validate(misspelt, schema)
    wrong_type = copy.deepcopy(document)
    wrong_type["spec"]["metrics"][0]["provider"]["prometheus"]["query"] = ["not", "a", "string"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(wrong_type, schema)
    metrics = copy.deepcopy(document["spec"]["metrics"])
    metrics[0]["count"], metrics[1]["provider"]["web"] = 1, {"url": "http://x"}
    metrics[0]["failureLimit"] = 2
    assert controller_errors(metrics) == ["metrics[0]: count must be >= failureLimit + consecutiveSuccessLimit",
                                          "metrics[0]: count must be >= inconclusiveLimit",
                                          "metrics[1]: exactly one provider"]


def test_export_options_are_held_to_the_controller_rules(draft_pair, baselines):
    for options, message in [({"analysis_engine": "trtllm"}, "analysis_engine='trtllm'"),
                             ({"interval": "1d"}, "interval='1d'"),  # Go durations have no days
                             ({"count": 1, "failure_limit": 2}, "count=1 must be at least failure_limit=2"),
                             ({"canary_label": "pod-hash"}, "canary_label='pod-hash'"),
                             ({"prometheus_address": "prometheus:9090"}, "prometheus_address")]:
        with pytest.raises(UsageError, match=re.escape(message)):
            render(draft_pair, baselines, **options)
    with pytest.raises(SpecregError, match="no recorded overall baseline"):
        render_export(draft_pair, {**baselines, "overall": {}}, "argo-analysis", approved=True)


# --- one source of truth with the alert rules -----------------------------------------------------

@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_queries_and_floors_are_the_alert_rules_own(engine, draft_pair, baselines):
    rules = yaml.safe_load(dict(render_export(draft_pair, baselines, "prometheus-rules", approved=True,
                                              options={"rules_engine": engine}))["prometheus-rules.yaml"])
    alerts = {rule["annotations"]["summary"].split(": live ")[1].split(" ")[0]: rule
              for rule in rules["groups"][0]["rules"]}
    document = render(draft_pair, baselines, analysis_engine=engine)
    canary = ',rollouts_pod_template_hash="{{args.canary-hash}}"'
    for metric, figure in zip(document["spec"]["metrics"], ("acceptance_rate", "mean_acceptance_length")):
        floor = alerts[figure]["annotations"]["floor"]
        assert metric["successCondition"] == f"result[0] >= {floor}"
        assert metric["failureCondition"] == f"result[0] < {floor}"
        query = metric["provider"]["prometheus"]["query"]
        assert f"({query.replace(canary, '')}) < {floor}" == alerts[figure]["expr"]


def test_llamacpp_queries_read_its_counters_without_a_model_label(draft_pair, baselines):
    document = render(draft_pair, baselines, analysis_engine="llamacpp")
    queries = [m["provider"]["prometheus"]["query"] for m in document["spec"]["metrics"]]
    assert queries == list(llamacpp.alert_expressions('{rollouts_pod_template_hash="{{args.canary-hash}}"}',
                                                      "5m").values())
    assert all("llamacpp:spec_decode_num_" in q and "model_name" not in q for q in queries)


# --- promtool on canary series --------------------------------------------------------------------

def counter_series(names: tuple[str, str, str], labels: str, alpha: float, tau: float) -> list[dict]:
    """Per-minute counter increments giving acceptance rate ``alpha`` and tau ``tau``: 1000
    accepted tokens, 1000 / alpha drafted tokens, 1000 / (tau - 1) draft steps."""
    drafts, draft_tokens, accepted = names
    return [{"series": f"{drafts}{labels}", "values": f"0+{1000 / (tau - 1)}x40"},
            {"series": f"{draft_tokens}{labels}", "values": f"0+{1000 / alpha}x40"},
            {"series": f"{accepted}{labels}", "values": "0+1000x40"}]


def engine_series(engine: str, pod_hash: str, alpha: float, tau: float) -> list[dict]:
    pod = f'rollouts_pod_template_hash="{pod_hash}",pod="chat-{pod_hash}-x1"'
    if engine == "vllm":
        return counter_series((vllm.DRAFTS, vllm.DRAFT_TOKENS, vllm.ACCEPTED),
                              f'{{model_name="chat-pair",engine="0",{pod}}}', alpha, tau)
    if engine == "llamacpp":  # llama-server labels nothing; the scrape adds the pod's labels
        return counter_series((llamacpp.DRAFTS, llamacpp.DRAFT_TOKENS, llamacpp.ACCEPTED), f"{{{pod}}}", alpha, tau)
    labels = f'{{model_name="chat-pair",{pod}}}'
    return [{"series": f"{sglang.ACCEPT_RATE}{labels}", "values": f"{alpha}x40"},
            {"series": f"{sglang.ACCEPT_LENGTH}{labels}", "values": f"{tau}x40"}]


def below(drop: float) -> tuple[float, float]:
    """Acceptance rate and tau ``drop`` below the baseline (tau's accepted part, as its floor)."""
    return ALPHA * (1 - drop), 1 + (TAU - 1) * (1 - drop)


@pytest.mark.parametrize("engine", ENGINES)
def test_promtool_canary_at_9_5_percent_below_passes_and_at_10_5_fails(engine, draft_pair, baselines, tmp_path):
    promtool = tool("promtool")
    document = render(draft_pair, baselines, analysis_engine=engine, tolerance=TOLERANCE)
    metrics = document["spec"]["metrics"]
    tests, expectations = [], []
    for drop, passes in ((0.095, True), (0.105, False)):
        alpha, tau = below(drop)
        # the stable pods run far below the floor: only the canary's series may count
        series = engine_series(engine, CANARY, alpha, tau) + engine_series(engine, STABLE, 0.2, 1.3)
        expr_tests = []
        for metric, live in zip(metrics, (alpha, tau)):
            query = metric["provider"]["prometheus"]["query"].replace("{{args.canary-hash}}", CANARY)
            success = re.fullmatch(r"result\[0\] >= ([0-9.]+)", metric["successCondition"]).group(1)
            # the query's value, and the success and failure conditions evaluated by Prometheus
            expr_tests.append({"expr": f"abs(({query}) - {live}) < bool 1e-9", "eval_time": "20m",
                               "exp_samples": [{"labels": "{}", "value": 1}]})
            for op, holds in ((">=", passes), ("<", not passes)):
                expr_tests.append({"expr": f"({query}) {op} bool {success}", "eval_time": "20m",
                                   "exp_samples": [{"labels": "{}", "value": int(holds)}]})
            expectations.append((metric, live, passes))
        tests.append({"interval": "1m", "input_series": series, "promql_expr_test": expr_tests})
    (tmp_path / "argo-test.yaml").write_text(yaml.safe_dump({"tests": tests}, sort_keys=False))
    result = subprocess.run([promtool, "test", "rules", "argo-test.yaml"], cwd=tmp_path, capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    for metric, live, passes in expectations:  # the conditions as Argo evaluates them on result = [live]
        assert condition_holds(metric["successCondition"], [live]) is passes, (metric["name"], live)
        assert condition_holds(metric["failureCondition"], [live]) is not passes, (metric["name"], live)


def test_an_idle_canary_is_inconclusive(draft_pair, baselines):
    """No drafts: the counters' ratio is NaN, neither condition holds, and Argo counts the
    measurement inconclusive (inconclusiveLimit), as the alert rules stay silent."""
    for metric in render(draft_pair, baselines)["spec"]["metrics"]:
        assert not condition_holds(metric["successCondition"], [float("nan")])
        assert not condition_holds(metric["failureCondition"], [float("nan")])


def test_promtool_harness_can_fail(draft_pair, baselines, tmp_path):
    """Expecting the 10.5 % canary to pass is an error promtool reports."""
    promtool = tool("promtool")
    metric = render(draft_pair, baselines)["spec"]["metrics"][0]
    query = metric["provider"]["prometheus"]["query"].replace("{{args.canary-hash}}", CANARY)
    alpha, tau = below(0.105)
    test = {"interval": "1m", "input_series": engine_series("vllm", CANARY, alpha, tau),
            "promql_expr_test": [{"expr": f"({query}) >= bool 0.639", "eval_time": "20m",
                                  "exp_samples": [{"labels": "{}", "value": 1}]}]}
    (tmp_path / "t.yaml").write_text(yaml.safe_dump({"tests": [test]}))
    result = subprocess.run([promtool, "test", "rules", "t.yaml"], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode != 0

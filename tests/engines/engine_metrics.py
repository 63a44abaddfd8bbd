"""Prometheus exposition text made by an engine's own metric-logging code, fed known counts.

Usage: python engine_metrics.py vllm CASES.json OUT.json (run by test_engine_metrics.py
with the unpacked engine wheel first on sys.path, as engine_check.py is; imports nothing from specreg).

vLLM: each case's steps are (draft tokens, accepted tokens) of one request's verification, per
engine index. Each goes through the scheduler's own Scheduler.make_spec_decoding_stats (which
drops a step without draft tokens, as the running scheduler does), then into a SchedulerStats that
PrometheusStatLogger.record() writes to its counters, and into SpecDecodingLogging, whose
log line gives vLLM's own mean acceptance length and per-position rates for the interval. The
text is prometheus_client.generate_latest() of the registry vLLM's /metrics serves, taken once
after the "history" steps and once after the "interval" steps.

SGLang 0.5.23's SchedulerMetricsCollector cannot be imported here: its module imports
sglang.srt.configs, two of whose model configs import torchvision at module level, and no
torchvision build loads against the CPU torch 2.13 on this machine (PyPI's 0.28 wheel is built for
CUDA torch). Its gauges are read by the tests in tests/observe, under the names and labels
templates/engines/sglang-0.5.23.json records from the wheel.
"""

from __future__ import annotations

import sys
import types

from engine_script import run_cases  # first: the CPU and offline settings, before any engine import


def vllm_exposition(case: dict) -> dict:
    import prometheus_client
    from engine_check import vllm_parser
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.metrics.loggers import PrometheusStatLogger
    from vllm.v1.metrics.stats import SchedulerStats
    from vllm.v1.spec_decode.metrics import SpecDecodingLogging

    parser, command = vllm_parser()
    args = parser.parse_args(case["argv"][1:])
    command.validate(args)
    args.model = args.model_tag
    config = AsyncEngineArgs.from_cli_args(args).create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    engines = sorted({int(e) for phase in ("history", "interval") for e in case[phase]})
    prometheus = PrometheusStatLogger(config, engine_indexes=engines)
    # make_spec_decoding_stats reads only these two attributes of the scheduler
    scheduler = types.SimpleNamespace(log_stats=True, num_spec_tokens=config.speculative_config.num_speculative_tokens)
    texts, logged = {}, []
    for phase in ("history", "interval"):
        logging = SpecDecodingLogging()
        for engine, steps in case[phase].items():
            for num_draft_tokens, num_accepted in steps:
                stats = Scheduler.make_spec_decoding_stats(scheduler, None, num_draft_tokens, num_accepted, None, "r")
                if stats is not None:
                    prometheus.record(SchedulerStats(spec_decoding_stats=stats), None, engine_idx=int(engine))
                    logging.observe(stats)
        if phase == "interval":
            logging.log(log_fn=lambda message, *values: logged.extend(values))
        texts[phase] = prometheus_client.generate_latest(prometheus_client.REGISTRY).decode()
    # SpecDecodingLogging.log's arguments: mean acceptance length, accepted/drafted throughput,
    # accepted, drafted, per-position rates (", "-joined, 3 decimals), acceptance rate in %
    return {"id": case["id"], "before": texts["history"], "after": texts["interval"],
            "served_model_name": config.model_config.served_model_name,
            "vllm_log": {"mean_acceptance_length": float(logged[0]), "accepted": int(logged[3]),
                         "drafted": int(logged[4]), "per_position": [float(r) for r in logged[5].split(", ")],
                         "acceptance_rate_percent": float(logged[6])} if logged else None}


if __name__ == "__main__":
    sys.exit(run_cases({"vllm": lambda cases: {"results": [vllm_exposition(case) for case in cases], "stand_ins": []}}))

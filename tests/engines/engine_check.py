"""Run exported command lines through an engine's own released code; one process per engine.

Usage: python engine_check.py vllm|sglang CASES.json OUT.json

Runs with the unpacked engine wheel and its dependencies first on sys.path (see conftest.py);
imports nothing from specreg. CASES.json is a list of {"id", "argv"} with argv as the export's
shell script hands it to the engine executable; OUT.json gets one result per case: what the
engine's code made of it, or the first line of the error the engine raised; and "schema",
the content of templates/engines/<engine>-<version>.json as read from the engine's code.

vLLM: the `vllm serve` parser built as vllm.entrypoints.cli.main builds it (ServeSubcommand),
its validate(), AsyncEngineArgs.from_cli_args, create_engine_config() (which builds the target
ModelConfig and SpeculativeConfig, whose __post_init__ builds the draft ModelConfig), and the
scheduler's batch-size lookup build_dynamic_sd_schedule_lookup with the engine's max_num_seqs.
SGLang: sglang.srt.server_args.prepare_server_args (launch_server's parser and
ServerArgs.from_cli_args), which leaves the record unresolved, and the alias step of its
resolution (speculative_hook._resolve_speculative_algorithm_alias).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

# The CPU platform is selected by vLLM's own switch (vllm.platforms.cpu_platform_plugin reads
# VLLM_TARGET_DEVICE): no GPU module is replaced. Nothing may reach a model hub.
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

# Import-only stand-ins for GPU-only modules that fail to import on a CPU machine. Each name is
# printed to stderr when used; the tests assert the list stays as small as written here.
STAND_INS: tuple[str, ...] = ()


def error_line(exc: BaseException) -> str:
    """The engine's message in one line (pydantic puts the field and reason on lines 2-3)."""
    text = [line.strip() for line in str(exc).strip().splitlines()[:3]]
    return f"{type(exc).__name__}: {' | '.join(text)}"


def vllm_parser():
    import vllm.entrypoints.cli.serve as serve
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(description="vLLM CLI")
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    command = serve.ServeSubcommand()
    command.subparser_init(subparsers)
    return parser, command


def check_vllm(cases: list[dict]) -> list[dict]:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

    results = []
    for case in cases:
        argv = case["argv"]
        result: dict = {"id": case["id"]}
        try:
            assert argv[:2] == ["vllm", "serve"], f"not a vllm serve command: {argv[:2]}"
            parser, command = vllm_parser()
            args = parser.parse_args(argv[1:])
            command.validate(args)
            # ServeSubcommand.cmd's first step (vllm/entrypoints/cli/serve.py): the positional
            # model_tag is the model; the rest of cmd starts the server, which builds the config so.
            if getattr(args, "model_tag", None) is not None:
                args.model = args.model_tag
            engine_args = AsyncEngineArgs.from_cli_args(args)
            config = engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
            spec = config.speculative_config
            result["target_model"] = config.model_config.model
            result["target_revision"] = config.model_config.revision
            result["served_model_name"] = config.model_config.served_model_name
            result["max_num_seqs"] = config.scheduler_config.max_num_seqs
            result["host"], result["port"] = args.host, args.port
            if spec is None:
                result["speculative"] = None
            else:
                result["speculative"] = {
                    "method": spec.method,
                    "model": spec.model,
                    "num_speculative_tokens": spec.num_speculative_tokens,
                    "draft_tensor_parallel_size": spec.draft_tensor_parallel_size,
                    "revision": spec.revision,
                    "prompt_lookup_min": spec.prompt_lookup_min,
                    "prompt_lookup_max": spec.prompt_lookup_max,
                    "num_speculative_tokens_per_batch_size": (
                        [list(entry) for entry in spec.num_speculative_tokens_per_batch_size]
                        if spec.num_speculative_tokens_per_batch_size is not None else None),
                    "draft_model": spec.draft_model_config.model if spec.draft_model_config else None,
                    # after hf_config_override: an mtp target's config rewritten into its MTP drafter's
                    "draft_architectures": spec.draft_model_config.architectures if spec.draft_model_config else None,
                    "draft_model_type": (spec.draft_model_config.hf_config.model_type
                                         if spec.draft_model_config else None),
                    "draft_n_predict": (getattr(spec.draft_model_config.hf_config, "n_predict", None)
                                        if spec.draft_model_config else None),
                    "draft_vocab_size": spec.draft_model_config.get_vocab_size() if spec.draft_model_config else None,
                    "target_vocab_size": config.model_config.get_vocab_size(),
                }
                if spec.num_speculative_tokens_per_batch_size:
                    # The same call the scheduler makes (vllm/v1/core/sched/scheduler.py).
                    result["batch_size_lookup"] = build_dynamic_sd_schedule_lookup(
                        spec.num_speculative_tokens_per_batch_size,
                        vllm_max_batch_size=config.scheduler_config.max_num_seqs,
                        vllm_num_speculative_tokens=spec.num_speculative_tokens,
                    )
        except SystemExit as exc:  # argparse rejects by exiting
            result["error"] = f"SystemExit: argparse exit {exc.code}"
        except BaseException as exc:  # noqa: BLE001 - the engine's refusal is the result
            result["error"] = error_line(exc)
            result["traceback"] = traceback.format_exc()[-3000:]
        results.append(result)
    return results


def check_sglang(cases: list[dict]) -> list[dict]:
    from sglang.srt.arg_groups.speculative_hook import _resolve_speculative_algorithm_alias
    from sglang.srt.server_args import prepare_server_args

    fields = ("model_path", "revision", "served_model_name", "host", "port", "tp_size", "enable_metrics",
              "speculative_algorithm", "speculative_draft_model_path", "speculative_draft_model_revision",
              "speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens")
    results = []
    for case in cases:
        argv = case["argv"]
        result: dict = {"id": case["id"]}
        try:
            assert argv[:3] == ["python", "-m", "sglang.launch_server"], f"not an SGLang launch: {argv[:3]}"
            server_args = prepare_server_args(argv[3:])
            result["server_args"] = {name: getattr(server_args, name) for name in fields}
            # The algorithm the launch resolves it to (handle_speculative_decoding's alias step:
            # NEXTN -> EAGLE). The rest of ServerArgs.resolve_once, and this step given a draft path
            # (it reads the draft's config), import sglang.srt.configs, which imports torchvision:
            # no CPU build of it here, so those are not run.
            if server_args.speculative_draft_model_path is None:
                result["resolved_speculative_algorithm"] = _resolve_speculative_algorithm_alias(
                    server_args.speculative_algorithm, None)
        except SystemExit as exc:
            result["error"] = f"SystemExit: argparse exit {exc.code}"
        except BaseException as exc:  # noqa: BLE001
            result["error"] = error_line(exc)
            result["traceback"] = traceback.format_exc()[-3000:]
        results.append(result)
    return results


def parser_schema(parser) -> dict:
    """Every option of an argparse parser: {flag: {"type": integer|number|string|enum|flag|json}}."""
    import argparse

    flags = {}
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)) or not action.option_strings:
            continue
        if action.nargs == 0:
            spec = {"type": "flag"}
        elif action.choices is not None:
            spec = {"type": "enum", "choices": sorted(str(choice) for choice in action.choices)}
        elif action.type is int:
            spec = {"type": "integer"}
        elif action.type is float:
            spec = {"type": "number"}
        else:
            spec = {"type": "string"}
        for option in action.option_strings:
            if option.startswith("--"):
                flags[option] = dict(spec)
    return dict(sorted(flags.items()))


def schema_vllm() -> dict:
    import typing

    import vllm
    from vllm.config import SpeculativeConfig
    from vllm.config.speculative import SpeculativeMethod

    parser, _ = vllm_parser()
    serve_parser = parser._subparsers._group_actions[0].choices["serve"]
    flags = parser_schema(serve_parser)
    flags["--speculative-config"] = {"type": "json", "schema": "speculative_config"}

    def literals(tp) -> list[str]:
        out = []
        for arg in typing.get_args(tp):
            out.extend(literals(arg) if typing.get_args(arg) else [arg])
        return out

    methods = sorted(set(literals(SpeculativeMethod)))
    fields = SpeculativeConfig.__dataclass_fields__
    # Fields the engine fills in itself (not user keys): the configs built in __post_init__;
    # and tensor_parallel_size, which _verify_args refuses ("Please pass draft_tensor_parallel_size").
    internal = {"target_model_config", "target_parallel_config", "draft_model_config", "draft_parallel_config",
                "tensor_parallel_size"}
    properties = {}
    for name in sorted(fields):
        if name in internal:
            continue
        properties[name] = {}
    properties["method"] = {"enum": methods}
    properties["num_speculative_tokens"] = {"type": "integer", "minimum": 1}
    properties["num_speculative_tokens_per_batch_size"] = {
        "type": "array",
        "items": {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 3, "maxItems": 3},
    }
    for name in ("prompt_lookup_min", "prompt_lookup_max", "draft_tensor_parallel_size", "max_model_len"):
        properties[name] = {"type": "integer", "minimum": 1}
    for name in ("model", "revision"):
        properties[name] = {"type": "string"}
    return {
        "engine": "vllm",
        "engine_version": ".".join(vllm.__version__.split(".")[:2]),
        "engine_release": vllm.__version__,
        "source": "generated by scripts/engine_schemas.py from the vllm wheel: the `vllm serve` parser "
                  "(ServeSubcommand.subparser_init) and vllm.config.SpeculativeConfig / SpeculativeMethod",
        "command": ["vllm", "serve"],
        "positional": ["model"],
        "flags": flags,
        "speculative_config": {
            "type": "object",
            "additionalProperties": False,
            "required": ["method", "num_speculative_tokens"],
            "properties": properties,
        },
        "metrics": {
            "counters": [
                "vllm:spec_decode_num_drafts_total",
                "vllm:spec_decode_num_draft_tokens_total",
                "vllm:spec_decode_num_accepted_tokens_total",
                "vllm:spec_decode_num_accepted_tokens_per_pos_total",
            ],
            "labels": ["model_name", "engine", "position"],
        },
    }


def schema_sglang() -> dict:
    import argparse
    from importlib.metadata import version

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    return {
        "engine": "sglang",
        "engine_version": version("sglang"),
        "source": "generated by scripts/engine_schemas.py from the sglang wheel: ServerArgs.add_cli_args "
                  "(the parser of sglang.srt.server_args.prepare_server_args, used by sglang.launch_server)",
        "command": ["python", "-m", "sglang.launch_server"],
        "positional": [],
        "flags": parser_schema(parser),
        "metrics": {"gauges": ["sglang:spec_accept_length", "sglang:spec_accept_rate"], "labels": ["model_name"]},
    }


def main() -> int:
    engine, cases_path, out_path = sys.argv[1:4]
    started = time.monotonic()
    cases = json.loads(open(cases_path).read())
    # One import of the engine per run: the cases and the schema file's content together.
    if engine == "vllm":
        output = {"results": check_vllm(cases), "schema": schema_vllm()}
    elif engine == "sglang":
        output = {"results": check_sglang(cases), "schema": schema_sglang()}
    else:
        raise SystemExit(f"unknown engine {engine}")
    output["stand_ins"] = list(STAND_INS)
    output["seconds"] = round(time.monotonic() - started, 1)
    with open(out_path, "w") as handle:
        json.dump(output, handle, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())

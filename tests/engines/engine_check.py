"""Run exported command lines through an engine's own released code; one process per engine.

Usage: python engine_check.py vllm|sglang CASES.json OUT.json

Runs with the unpacked engine wheel and its dependencies first on sys.path (see conftest.py);
imports nothing from specreg. CASES.json is a list of {"id", "argv"} with argv as the export's
shell script hands it to the engine executable; OUT.json gets one result per case: what the
engine's code made of it, or the first line of the error the engine raised; and "schema",
the content of templates/engines/<engine>-<version>.json as read from the engine's code.

vLLM: the `vllm serve` parser built as vllm.entrypoints.cli.main builds it (ServeSubcommand),
its validate(), AsyncEngineArgs.from_cli_args, maybe_override_with_speculators (create_engine_config's
first step), create_engine_config() (which builds the target ModelConfig and SpeculativeConfig,
whose __post_init__ builds the draft ModelConfig), the EAGLE-3 aux layers as its V2 and V1 model
runners read them, and the scheduler's batch-size lookup build_dynamic_sd_schedule_lookup with the
engine's max_num_seqs; for a case with "load_draft", the draft model built and its weights loaded
as the proposer loads them, on the CPU (load_draft).
SGLang: the launch parser, the alias step, the whole argument resolution (with --device cpu), the
target and draft ModelConfig and the aux layers an EAGLE-3 target captures (check_sglang).
"""

from __future__ import annotations

import os
import sys
import traceback

from engine_script import run_cases  # first: the CPU and offline settings, before any engine import

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
    from types import SimpleNamespace

    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.transformers_utils.config import maybe_override_with_speculators
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup
    from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import get_eagle3_aux_layers_from_config
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    results = []
    for case in cases:
        argv = case["argv"]
        result: dict = {"id": case["id"]}
        # a case's "env": the variables vLLM's own switches read while it builds the config, e.g.
        # VLLM_USE_V2_MODEL_RUNNER (read on each access until the server caches envs), restored after
        saved = {name: os.environ.get(name) for name in case.get("env", {})}
        os.environ.update(case.get("env", {}))
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
            # create_engine_config's first step: a served speculators head folder is replaced by its
            # verifier.name_or_path (model and tokenizer); recorded here, before a hub id fails offline
            result["speculators_override"] = list(maybe_override_with_speculators(
                model=engine_args.model, tokenizer=engine_args.tokenizer, trust_remote_code=False,
                revision=engine_args.revision, vllm_speculative_config=engine_args.speculative_config)[:2])
            config = engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
            spec = config.speculative_config
            result["target_model"] = config.model_config.model
            result["target_tokenizer"] = config.model_config.tokenizer
            result["target_revision"] = config.model_config.revision
            result["served_model_name"] = config.model_config.served_model_name
            result["dtype"] = str(config.model_config.dtype)
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
                    "draft_sample_method": spec.draft_sample_method,
                    # what SpeculativeConfig kept of a suffix export (its _validate_suffix_decoding passed)
                    **{name: getattr(spec, name) for name in (
                        "suffix_decoding_max_tree_depth", "suffix_decoding_max_cached_requests",
                        "suffix_decoding_max_spec_factor", "suffix_decoding_min_token_prob")},
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
                    # the target layers whose entering state vLLM hands an EAGLE-3 head: its runner's
                    # reading of the draft config (the Llama target appends the state at idx + 1
                    # after layer idx, models/llama.py, so an id is the state entering that layer)
                    # (a block drafter's too: both runners add one to DFlash's and dense DSpark's
                    # target_layer_ids, which name layer outputs)
                    "eagle3_aux_layers": (list(get_eagle3_aux_layers_from_config(spec) or [])
                                          if spec.method in HEADS_ON_TARGET_STATES else None),
                    # the same as the V1 runner reads it (on a CPU, or VLLM_USE_V2_MODEL_RUNNER=0); an
                    # empty list: neither names ids, so the target's default layers are used
                    "eagle3_aux_layers_v1": (list(GPUModelRunner._get_eagle3_aux_layers_from_config(
                        SimpleNamespace(speculative_config=spec)) or []) if spec.method in HEADS_ON_TARGET_STATES
                        else None),
                    # the head keeps its d2t only where its vocabulary is not the target's (llama_eagle3.py:339)
                    "draft_config_vocab_size": (getattr(spec.draft_model_config.hf_config, "draft_vocab_size", None)
                                                if spec.method == "eagle3" else None),
                }
                if case.get("load_draft"):
                    result["speculative"].update(load_draft(config))
                if spec.method in ("dflash", "dspark") or spec.parallel_drafting:
                    result["speculative"].update(block_drafter(spec))
                    # what keeps the GPU's default V2 model runner from it (P-EAGLE: vLLM then runs V1)
                    result["speculative"]["v2_runner_unsupported"] = config._get_v2_model_runner_unsupported_features()
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
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
        results.append(result)
    return results


HEADS_ON_TARGET_STATES = ("eagle3", "dflash", "dspark")


def load_draft(config) -> dict:
    """The draft model as vLLM's proposer loads it (llm_base_proposer._get_model, on the CPU): the
    proposer's draft config and load config, then the loader's steps (base_loader.load_model):
    initialize_model (create_model's step that builds the class vLLM's registry resolves for the
    draft architecture, in the engine's dtype; create_model's other step only logs online
    quantization) and load_weights (the safetensors iterator over the head's files into the class's
    own load_weights, which raises on a tensor no module has and asserts each shape). The
    kernel-format step after it (process_weights_after_loading) is left out: it reads no file. Every
    parameter is filled with NaN before the load: those still NaN after are what the head's files
    left unset."""
    from types import SimpleNamespace

    import torch
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader import get_model_loader
    from vllm.model_executor.model_loader.utils import get_draft_load_config, initialize_model
    from vllm.utils.torch_utils import set_default_torch_dtype
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

    single_process_groups(config)
    spec = config.speculative_config
    draft_config = SpecDecodeBaseProposer._create_draft_vllm_config(
        SimpleNamespace(speculative_config=spec, vllm_config=config))
    loader = get_model_loader(get_draft_load_config(draft_config))
    # the worker loads its models under the engine's config (the loader reads it: _init_ep_weight_filter)
    with set_current_vllm_config(draft_config), set_default_torch_dtype(spec.draft_model_config.dtype):
        with torch.device("cpu"):
            model = initialize_model(vllm_config=draft_config, model_config=spec.draft_model_config)
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.fill_(float("nan"))
        loader.load_weights(model, spec.draft_model_config)
    parameters = dict(model.named_parameters())
    return {"draft_class": type(model).__name__,
            "draft_parameters": {name: list(parameter.shape) for name, parameter in parameters.items()},
            "draft_unloaded": sorted(name for name, parameter in parameters.items() if parameter.isnan().any())}


def single_process_groups(config) -> None:
    """vLLM's distributed state for one process (world size 1, gloo), which its parallel layers read
    while they are built; once per process (the groups are sized from ``config``)."""
    import tempfile

    from vllm.config import set_current_vllm_config
    from vllm.distributed import parallel_state

    if parallel_state.model_parallel_is_initialized():
        return
    with set_current_vllm_config(config):
        parallel_state.init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                                    distributed_init_method=f"file://{tempfile.mktemp()}")
        parallel_state.ensure_model_parallel_initialized(1, 1)


def block_drafter(spec) -> dict:
    """What vLLM's proposer makes of a DFlash / DSpark head, or of a P-EAGLE head (eagle3 with
    parallel_drafting): parallel drafting (DFlash: 1 + k query slots a step, the anchor and k masked
    slots, v1/spec_decode/dflash.py; P-EAGLE: the verified tokens and k - 1 masked slots), the token id its masked slots
    carry (SpecDecodeBaseProposer._init_parallel_drafting_params, run on a holder of the attributes
    it reads), the draft architecture vLLM's registry loads, and whether its layers attend non-causally
    (qwen3_dflash.dflash_has_any_non_causal, the check the attention backend is chosen by)."""
    from types import SimpleNamespace

    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

    hf_config = spec.draft_model_config.hf_config
    holder = SimpleNamespace(draft_model_config=spec.draft_model_config, pass_hidden_states_to_model=False)
    SpecDecodeBaseProposer._init_parallel_drafting_params(holder)
    found = {"parallel_drafting": spec.parallel_drafting, "mask_token_id": holder.parallel_drafting_token_id,
             "draft_architectures": spec.draft_model_config.architectures}
    if spec.method == "dflash":
        from vllm.model_executor.models.qwen3_dflash import dflash_has_any_non_causal

        found["non_causal"] = dflash_has_any_non_causal(hf_config)
    return found


def check_sglang(cases: list[dict]) -> list[dict]:
    """Per case: the launch parser (prepare_server_args), the alias step with the draft's config
    (_resolve_speculative_algorithm_alias -> get_config), then SGLang's whole argument resolution
    (ServerArgs.resolve_once, runtime_context.publish) with one flag added, --device cpu: without an
    accelerator, resolution stops at get_device (serving_hook.handle_missing_default_values).
    On the resolved arguments: the target and draft ModelConfig (is_draft_model: the architecture
    rewrites of model_config.py), the model classes SGLang's registry picks for them, and the aux
    layers an EAGLE-3 target will capture: resolve_spec_aux_hidden_state_config, then the target
    class's own set_eagle3_layers_to_capture, the method SGLang's model runner calls with those ids
    (model_runner_components/attention_backend_setup.py), run on a holder of the attributes it sets."""
    from types import SimpleNamespace

    from sglang.srt import runtime_context
    from sglang.srt.arg_groups.overrides import resolved_view
    from sglang.srt.arg_groups.speculative_hook import _resolve_speculative_algorithm_alias
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_executor.model_runner_components.spec_aux_hidden_state import (
        resolve_spec_aux_hidden_state_config)
    from sglang.srt.models.registry import ModelRegistry
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

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
            result["resolved_speculative_algorithm"] = _resolve_speculative_algorithm_alias(
                server_args.speculative_algorithm, server_args.speculative_draft_model_path)
            resolved_args = prepare_server_args([*argv[3:], "--device", case.get("device", "cpu")])
            resolved_args.resolve_once()
            runtime_context.publish(resolved_args, role="scheduler")
            view = resolved_view(resolved_args)
            result["resolved"] = {name: getattr(view, name) for name in fields if name != "enable_metrics"}
            target = ModelConfig.from_server_args(resolved_args)
            result["target"] = {"architectures": target.hf_config.architectures,
                                "class": ModelRegistry.resolve_model_cls(target.hf_config.architectures)[1],
                                "num_hidden_layers": target.num_hidden_layers, "dtype": str(target.dtype)}
            draft = None
            if view.speculative_draft_model_path is not None:
                draft = ModelConfig.from_server_args(
                    resolved_args, model_path=view.speculative_draft_model_path,
                    model_revision=view.speculative_draft_model_revision, is_draft_model=True)
                result["draft"] = {"architectures": draft.hf_config.architectures,
                                   "model_type": draft.hf_config.model_type,
                                   "class": ModelRegistry.resolve_model_cls(draft.hf_config.architectures)[1],
                                   "num_hidden_layers": draft.num_hidden_layers,
                                   "hidden_size": draft.hf_config.hidden_size}
            algorithm = SpeculativeAlgorithm.from_string(view.speculative_algorithm)
            aux = resolve_spec_aux_hidden_state_config(server_args=resolved_args, model_config=target,
                                                       spec_algorithm=algorithm, is_draft_worker=False)
            result["eagle_aux_hidden_state_layer_ids"] = aux.eagle_aux_hidden_state_layer_ids
            if aux.eagle_use_aux_hidden_state:
                target_class = ModelRegistry.resolve_model_cls(target.hf_config.architectures)[0]
                holder = SimpleNamespace(pp_group=SimpleNamespace(is_last_rank=True), config=target.hf_config,
                                         model=SimpleNamespace())
                target_class.set_eagle3_layers_to_capture(holder, aux.eagle_aux_hidden_state_layer_ids)
                result["layers_to_capture"] = sorted(set(holder.model.layers_to_capture))
            if aux.dflash_use_aux_hidden_state:
                result.update(block_capture(aux, target, draft, resolved_args))
        except SystemExit as exc:
            result["error"] = f"SystemExit: argparse exit {exc.code}"
        except BaseException as exc:  # noqa: BLE001
            result["error"] = error_line(exc)
            result["traceback"] = traceback.format_exc()[-3000:]
        results.append(result)
    return results


def block_capture(aux, target, draft, resolved_args) -> dict:
    """A DFLASH / DSPARK launch as SGLang's model runner sets it up: the target layer ids its aux
    resolution chose, the layers the target class then captures (configure_aux_hidden_state_capture:
    set_dspark_layers_to_capture for DSPARK where the class has it, else set_dflash_layers_to_capture,
    run on a holder of the attributes they set), and the draft config as SGLang's DFlash parser reads
    it (mask token, block size; DSpark's gamma, the tokens drafted from the anchor)."""
    from types import SimpleNamespace

    from sglang.srt.models.registry import ModelRegistry
    from sglang.srt.speculative.dflash_utils import parse_dflash_draft_config

    target_class = ModelRegistry.resolve_model_cls(target.hf_config.architectures)[0]
    holder = SimpleNamespace(pp_group=SimpleNamespace(is_last_rank=True), config=target.hf_config,
                             model=SimpleNamespace())
    if aux.is_dspark and hasattr(target_class, "set_dspark_layers_to_capture"):
        target_class.set_dspark_layers_to_capture(holder, aux.dflash_target_layer_ids)
    else:
        target_class.set_dflash_layers_to_capture(holder, aux.dflash_target_layer_ids)
    parsed = parse_dflash_draft_config(draft_hf_config=draft.hf_config)
    found = {"dflash_target_layer_ids": list(aux.dflash_target_layer_ids),
             "layers_to_capture": sorted(set(holder.model.layers_to_capture)),
             "block": {"mask_token_id": parsed.mask_token_id, "block_size": parsed.block_size,
                       "num_draft_tokens": resolved_args.speculative_num_draft_tokens}}
    if aux.is_dspark:
        # the worker's own resolution (DSparkWorker's: resolve_runtime_config) and whether it samples the anchor row
        from sglang.srt.speculative.dspark_components.dspark_config import (get_dspark_sample_from_anchor,
                                                                            resolve_runtime_config)

        runtime = resolve_runtime_config(draft_hf_config=draft.hf_config,
                                         speculative_num_draft_tokens=resolved_args.speculative_num_draft_tokens,
                                         target_vocab_size=target.vocab_size)
        found["block"].update(gamma=runtime.gamma, verify_num_draft_tokens=runtime.verify_num_draft_tokens,
                              mask_token_id=runtime.mask_token_id,
                              sample_from_anchor=get_dspark_sample_from_anchor(draft.hf_config))
    return found


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


if __name__ == "__main__":
    # one import of the engine per run: the cases and the schema file's content together
    sys.exit(run_cases({
        "vllm": lambda cases: {"results": check_vllm(cases), "schema": schema_vllm(), "stand_ins": list(STAND_INS)},
        "sglang": lambda cases: {"results": check_sglang(cases), "schema": schema_sglang(),
                                 "stand_ins": list(STAND_INS)},
    }))

"""A loopback HTTP server whose /generate answers are built by SGLang 0.5.23's own code.

Run with the unpacked SGLang wheel and its dependency layers first on sys.path (engine_env). It
answers ``POST /generate`` (``input_ids``) and ``GET /get_server_info`` as ``sglang serve`` does.
What it generates is scripted (scripted_target.py, no model), but the answer is SGLang's: the
launch arguments go through ``prepare_server_args`` / ``resolve_once`` / ``runtime_context.publish``
(so ``speculative_num_draft_tokens`` is SGLang's own resolution), the body is parsed by
``GenerateReqInput``, each verify step updates the scheduler's ``Req`` counters the way
batch_result_processor.py does (``spec_verify_ct``, ``spec_num_correct_drafts``,
``update_spec_correct_drafts_histogram``), and ``TokenizerManager._handle_batch_output`` turns a
``BatchStrOutput`` into the response dict (meta_info: completion_tokens, spec_verify_ct,
spec_num_proposed_drafts, histogram via ``_calculate_spec_decoding_metrics``; output_top_logprobs
via ``convert_logprob_style``). ``--margin`` / ``--swap-at`` as in vllm_spec_server.py.

    python sglang_spec_server.py --plans '[[K, (--margin M), (--swap-at P), --, SGLANG LAUNCH ARGUMENTS], ...]'
    (one server per plan, forked after SGLang's import: scripted_target.serve_plans; prints each
    port, then serves; K 0: a target-only reference server, launched without a draft)
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from types import SimpleNamespace

import sglang
from sglang.srt import runtime_context
from sglang.srt.managers.io_struct import BatchStrOutput, GenerateReqInput
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.managers.tokenizer_manager import ReqState, TokenizerManager
from sglang.srt.observability.req_time_stats import APIServerReqTimeStats
from sglang.srt.server_args import prepare_server_args

from scripted_target import generation, option, serve, serve_plans, target_top


def tokenizer_manager() -> TokenizerManager:
    """SGLang's TokenizerManager with the fields _handle_batch_output reads, as a server with
    metrics, LoRA and request dumps off sets them; no scheduler or detokenizer behind it."""
    manager = object.__new__(TokenizerManager)
    manager.rid_to_state = {}
    manager.enable_metrics = False
    manager.enable_lora = False
    manager.skip_tokenizer_init = False
    manager.incremental_streaming_output = False
    manager.dump_requests_folder = manager.crash_dump_folder = ""
    return manager


def answer(manager: TokenizerManager, body: dict, k: int, margin: float, swap_at: int) -> dict:
    """One non-streaming /generate request through SGLang's scheduler counters and tokenizer manager."""
    request = GenerateReqInput(**body)
    request.normalize_batch_and_arguments()
    rid = request.rid
    tokens, targets, steps = generation(request.input_ids, request.sampling_params["max_new_tokens"], k, swap_at)
    # the scheduler's per-request counters, updated per verify step as batch_result_processor.py does
    counters = object.__new__(Req)
    counters.spec_verify_ct, counters.spec_num_correct_drafts, counters.spec_correct_drafts_histogram = 0, 0, []
    for _, accepted in steps:
        if k:
            counters.spec_verify_ct += 1
            counters.spec_num_correct_drafts += accepted
            counters.update_spec_correct_drafts_histogram(accepted)
    width = request.top_logprobs_num if request.return_logprob else 0
    tops = [target_top(target, margin) for target in targets]
    state = ReqState([], False, asyncio.Event(), request, APIServerReqTimeStats())
    manager.rid_to_state[rid] = state
    n = len(tokens)
    logprob = request.return_logprob
    batch = BatchStrOutput(
        rids=[rid], finished_reasons=[{"type": "length", "length": n}], output_strs=[""], output_ids=[tokens],
        prompt_tokens=[len(request.input_ids)], reasoning_tokens=[0], completion_tokens=[n], cached_tokens=[0],
        input_token_logprobs_val=[[]] if logprob else None, input_token_logprobs_idx=[[]] if logprob else None,
        output_token_logprobs_val=[[top[1][top[0].index(t)] for t, top in zip(tokens, tops)]] if logprob else None,
        output_token_logprobs_idx=[list(tokens)] if logprob else None,
        input_top_logprobs_val=[[]] if width else None, input_top_logprobs_idx=[[]] if width else None,
        output_top_logprobs_val=[[top[1][:width] for top in tops]] if width else None,
        output_top_logprobs_idx=[[top[0][:width] for top in tops]] if width else None,
        input_token_ids_logprobs_val=None, input_token_ids_logprobs_idx=None,
        output_token_ids_logprobs_val=None, output_token_ids_logprobs_idx=None, output_token_entropy_val=None,
        output_token_sampling_mask=None,
        output_hidden_states=None, routed_experts=None, indexer_topk=None, placeholder_tokens_idx=None,
        placeholder_tokens_val=None, retraction_counts=[0],
        spec_verify_ct=[counters.spec_verify_ct], spec_num_correct_drafts=[counters.spec_num_correct_drafts],
        spec_correct_drafts_histogram=[counters.spec_correct_drafts_histogram])
    asyncio.run(manager._handle_batch_output(batch))
    return state.out_list[-1]


def main() -> int:
    k = int(sys.argv[1])
    margin, swap_at = option("--margin", 4.0), int(option("--swap-at", -1))
    launch = sys.argv[sys.argv.index("--") + 1:]
    server_args = prepare_server_args([*launch, "--device", "cpu"])
    server_args.resolve_once()
    runtime_context.publish(server_args, role="tokenizer")
    manager = tokenizer_manager()
    lock = threading.Lock()

    def get(path):
        if path == "/get_server_info":
            return 200, json.dumps({"version": sglang.__version__, "model_path": server_args.model_path}).encode(), \
                "application/json"
        return None

    def post(body):
        with lock:
            return answer(manager, body, k, margin, swap_at)

    return serve(get, "/generate", "input_ids", post)


if __name__ == "__main__":
    sys.exit(serve_plans(main))

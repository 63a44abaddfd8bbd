"""Validation in a serving engine, end to end (``specreg validate-engine NAME@V --engine ENGINE``,
also spelled ``specreg validate NAME@V --engine ENGINE``).

Local llama.cpp: start ``llama-server`` from the pair's ``llamacpp`` export (with the draft, and
the same command without it). Local vLLM (``--engine vllm`` without ``--engine-url``): start vLLM
for the CPU (`make vllm`) on the pair's ``vllm`` export, with and without its speculative config
(registry/deploy/engines/vllm_server.py). Then send every golden prompt as token ids (greedy;
llama.cpp's export drafts with ``--spec-draft-p-min 0`` from F32/BF16 GGUF), read acceptance the
engine's way (per response counts and the ``/metrics`` counters around each request), decode the
same token ids on our runtime, and judge parity, equivalence in the engine and throughput per
concurrency tier. ``--engine-url URL --engine vllm|sglang``: the same against a server someone
else started (a GPU cluster, tensor parallel). The result is the pair's engine baseline, stamped
with the engine's name, version and build; every server started here is stopped (a vLLM by its
process group), also on Ctrl-C, SIGTERM and errors.

One module a job:
- ``request``: what a run is asked (EngineValidationRequest), its defaults and checks;
- ``run``: one run from start to the recorded engine baseline (validate_in_engine);
- ``local_engines``: llama.cpp and vLLM started here; ``remote_engine``: a server at a URL;
- ``runtime_rows``: our runtime's side, the same token ids decoded on the engine's schedule.
The passes through an engine are registry/deploy/engine_passes.py's; the status a baseline is
recorded with, registry/governance/engine_baseline_standing.py's.
"""

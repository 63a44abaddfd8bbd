"""Engine figures that cannot lie unnoticed (E01, E02, E04, E05), against a
loopback server that answers as a vLLM server would, or as a hostile one does. Before: a server
reporting alpha 1.0, tau 1.000004 and fewer draft tokens than drafts was recorded as a passed
engine baseline and its tau became the exported floor; one trickling a byte a second was still
being read after 150 s; a JSON list, NaN counts, `http://[::1` or `http://a b` were tracebacks; a
redirect to another internal address was followed. An engine baseline whose acceptance differs
from our runtime's beyond the parity tolerance is recorded but used by nothing until an enrolled
approver who did not register the pair signs its acceptance. Store cases on SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from clirun import one_line, run  # tests/ is on sys.path (tests/conftest.py)
from pgroles import as_user

sys.path.insert(0, str(Path(__file__).parent.parent / "governance"))
from govstate import POLICY_TOML, record_validation  # noqa: E402

K = 3


class FakeEngine:
    """A vLLM-shaped server on 127.0.0.1: /version, /v1/models, /metrics (the spec-decode
    counters) and /v1/completions, whose answers ``behave(path, body)`` may replace: return
    (status, headers, body bytes) or None for the honest default. ``steps`` (drafts,
    draft_tokens, accepted, per-position list) is what one completion adds to the counters."""

    def __init__(self, behave=None, steps=(4, 12, 6, [3, 2, 1]), metrics_text=None):
        self.behave, self.steps, self.metrics_text = behave, steps, metrics_text
        self.counters = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "per_position": [0] * K}
        self.hits: list[str] = []
        engine = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                engine.answer(self, None)

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                engine.answer(self, json.loads(self.rfile.read(length) or b"null"))

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        # polled every 50 ms: close() waits for the loop's next poll (0.5 s by default, after every test)
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def metrics(self) -> str:
        if self.metrics_text is not None:
            return self.metrics_text
        c, labels = self.counters, 'model_name="served",engine="0"'
        lines = [f"vllm:spec_decode_num_drafts_total{{{labels}}} {c['drafts']}",
                 f"vllm:spec_decode_num_draft_tokens_total{{{labels}}} {c['draft_tokens']}",
                 f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}} {c['accepted']}"]
        lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="{i}"}} {v}'
                  for i, v in enumerate(c["per_position"])]
        return "\n".join(lines) + "\n"

    def answer(self, handler, body) -> None:
        self.hits.append(handler.path)
        special = self.behave(handler.path, body) if self.behave else None
        if special is None:
            if handler.path == "/version":
                special = (200, {}, json.dumps({"version": "0.33.0"}).encode())
            elif handler.path == "/v1/models":
                special = (200, {}, json.dumps({"data": [{"id": "served"}]}).encode())
            elif handler.path == "/metrics":
                special = (200, {"Content-Type": "text/plain"}, self.metrics().encode())
            else:
                drafts, draft_tokens, accepted, per_position = self.steps
                c = self.counters
                c["drafts"] += drafts
                c["draft_tokens"] += draft_tokens
                c["accepted"] += accepted
                c["per_position"] = [a + b for a, b in zip(c["per_position"], per_position)]
                tokens = [5 + i for i in range(body["max_tokens"])]
                special = (200, {}, json.dumps({"choices": [{"token_ids": tokens, "finish_reason": "length"}]}).encode())
        status, headers, data = special
        if callable(data):  # a writer of its own (a trickle)
            data(handler)
            return
        handler.send_response(status)
        for key, value in {"Content-Type": "application/json", "Content-Length": str(len(data)), **headers}.items():
            handler.send_header(key, value)
        handler.end_headers()
        handler.wfile.write(data)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def engine_server():
    made = []

    def make(**kwargs) -> FakeEngine:
        made.append(FakeEngine(**kwargs))
        return made[-1]

    yield make
    for server in made:
        server.close()


@pytest.fixture
def validated(db_url, models):
    """``validated(alpha, draft)``: pair@1 (the target and ``models[draft]``) registered by tester
    with a passed validation of acceptance rate ``alpha`` on the smoke set -> (db_url, ref).
    `validate --engine` compares the engine with our runtime's own decode on the engine's schedule,
    not with the recorded figure: the "self" draft (the target's copy) accepts every draft there."""
    from specreg.api import Registry

    def make(alpha: float = 0.5, draft: str = "draft"):
        registry = Registry(db_url)
        ref = registry.register("pair", target=str(models["target"]), draft=str(models[draft]),
                                num_speculative_tokens=K).version.label
        record_validation(registry, ref, acceptance_rate=alpha, mean_acceptance_length=1 + K * alpha)
        return db_url, ref

    return make


def validate_engine(db_url, ref, url, *extra):
    return run("validate", ref, "--engine", "vllm", "--engine-url", url, "--golden", "smoke", "--concurrency", "1",
               "--db", db_url, "--json", *extra)


# --- E01: counts checked for consistency --------------------------------------------------------

def test_a_lying_server_is_a_failed_baseline_and_never_the_exported_floor(validated, engine_server):
    """alpha 1.0 and tau 1.000004: one accepted of one drafted token per request, in 250000 steps
    with drafts. Parity alone holds (our runtime recorded 1.0); the counts cannot all be true."""
    db_url, ref = validated(1.0, "self")
    liar = engine_server(steps=(250_000, 1, 1, [1, 0, 0]))
    done = validate_engine(db_url, ref, liar.url)
    assert done.returncode == 100, done.stderr
    baseline = json.loads(done.stdout)
    assert baseline["status"] == "failed"
    checks = {c["name"]: c for c in baseline["report"]["checks"]}
    assert checks["engine_parity"]["status"] != "fail"  # the figures look fine ...
    assert checks["engine_counts"]["status"] == "fail"  # ... the counts behind them cannot be
    assert "250000 steps with drafts but 1 drafted tokens" in checks["engine_counts"]["summary"]
    exported = run("export", ref, "--format", "vllm", "--force", "--db", db_url)
    assert exported.returncode == 0, exported.stderr
    assert "1.000004" not in exported.stdout and "measured in vllm" not in exported.stdout


@pytest.mark.parametrize("row,problem", [
    ({"drafted": 4, "accepted": 5, "draft_steps": 2, "accepted_per_position": None}, "5 accepted of 4 drafted tokens"),
    ({"drafted": 4, "accepted": 3, "draft_steps": 5, "accepted_per_position": None}, "5 steps with drafts but 4 drafted"),
    ({"drafted": 9, "accepted": 3, "draft_steps": 3, "accepted_per_position": [1, 2, 0]}, "increases"),
    ({"drafted": 9, "accepted": 4, "draft_steps": 3, "accepted_per_position": [2, 1, 0]}, "sums to 3, not the 4"),
    ({"drafted": 9, "accepted": 4, "draft_steps": 1, "accepted_per_position": [2, 2, 0]}, "2 accepted at position 0 in 1"),
])
def test_each_count_relation_is_checked(row, problem):
    from specreg.validators.engine import check_counts, count_problems

    assert count_problems({"record": "r", **row}) and problem in "; ".join(count_problems(row))
    assert check_counts([{"record": "r", **row}], engine_name="vllm").status == "fail"
    honest = {"record": "r", "drafted": 9, "accepted": 6, "draft_steps": 3, "accepted_per_position": [3, 2, 1]}
    assert count_problems(honest) == [] and check_counts([honest], engine_name="vllm").status == "pass"


# --- the acceptance of a baseline beyond the parity tolerance -----------------------------------

ACCEPT_POLICY = POLICY_TOML.replace("[environments.production]",
                                   "[environments.production]\nrequired_engine_baselines = [\"vllm\"]")


def test_a_baseline_beyond_the_parity_tolerance_counts_only_once_an_approver_accepts_it(
        validated, engine_server, approval_key, tmp_path):
    """Our runtime decodes alpha 1.0 (the self draft); the engine measures 0.5 (consistent counts).
    Even with --parity-tolerance 0.9 the baseline is unaccepted: no export, no gate, until bob
    (enrolled, not the registrant, not who ran it) signs its acceptance. The registrant cannot
    accept it."""
    from specreg.api import Registry

    db_url, ref = validated(1.0, "self")
    policy = tmp_path / "policy.toml"
    policy.write_text(ACCEPT_POLICY.replace("approval_required = true", "approval_required = false"))
    server = engine_server(steps=(4, 12, 6, [3, 2, 1]))  # alpha 0.5, tau 2.5
    done = validate_engine(db_url, ref, server.url, "--parity-tolerance", "0.9")
    assert done.returncode == 100, done.stderr
    baseline = json.loads(done.stdout)
    assert baseline["status"] == "unaccepted"
    assert baseline["report"]["acceptance_reason"].startswith("alpha 0.5000 in the engine vs 1.0000 on our runtime")
    from policyrecord import record_policy

    record_policy(db_url, policy, tmp_path)
    registry = Registry(db_url)
    assert registry.engine_baseline(registry.get(ref), "vllm") is None  # exports and alerts keep ours
    exported = run("export", ref, "--format", "vllm", "--force", "--db", db_url).stdout
    assert "acceptance_rate=1.0000" in exported and "measured in vllm" not in exported
    gate = registry.gate(ref, "production")
    condition = next(c for c in gate.conditions if c.name == "engine_baseline.vllm")
    assert not condition.passed and "is unaccepted" in condition.reason
    assert f"specreg engine-baselines accept {ref} {baseline['id']} --key FILE" in condition.reason

    # tester registered the pair and ran the engine validation: refused, one line
    own = approval_key(db_url, "tester")
    one_line(run("engine-baselines", "accept", ref, str(baseline["id"]), "--key", own, "--db", db_url,
                 env={"SPECREG_USER": "tester"}), 100, "four-eyes: tester registered")
    # carol signing with bob's key: a key not enrolled to the actor is refused
    bob_key = approval_key(db_url, "bob")
    one_line(run("engine-baselines", "accept", ref, str(baseline["id"]), "--key", bob_key, "--db",
                 as_user(db_url, "carol"), env={"SPECREG_USER": "carol"}), 100, "not to carol")
    accepted = run("engine-baselines", "accept", ref, str(baseline["id"]), "--key", bob_key, "--note",
                   "engine numerics (bf16)", "--db", as_user(db_url, "bob"), "--json", env={"SPECREG_USER": "bob"})
    assert accepted.returncode == 0, accepted.stderr
    assert json.loads(accepted.stdout)["why"] == "accepted by bob"
    found = registry.engine_baseline(registry.get(ref), "vllm")
    assert found is not None and found.id == baseline["id"]
    assert "acceptance_rate=0.5000" in run("export", ref, "--format", "vllm", "--force", "--db", db_url).stdout
    gate = registry.gate(ref, "production")
    condition = next(c for c in gate.conditions if c.name == "engine_baseline.vllm")
    assert condition.passed and condition.details["accepted_by"] == "bob", condition.reason
    listed = json.loads(run("engine-baselines", "list", ref, "--db", db_url, "--json").stdout)
    assert [(b["status"], b["counts"], b["accepted_by"]) for b in listed] == [("unaccepted", True, "bob")]
    assert registry.verify_audit()[1] is None
    # a second acceptance of what counts already: one line
    one_line(run("engine-baselines", "accept", ref, str(baseline["id"]), "--key", bob_key, "--db",
                 as_user(db_url, "bob"), env={"SPECREG_USER": "bob"}), 2, "counts already (accepted by bob)")


def test_a_failed_baseline_cannot_be_accepted(validated, engine_server, approval_key):
    db_url, ref = validated(1.0, "self")
    liar = engine_server(steps=(250_000, 1, 1, [1, 0, 0]))
    baseline = json.loads(validate_engine(db_url, ref, liar.url).stdout)
    one_line(run("engine-baselines", "accept", ref, str(baseline["id"]), "--key", approval_key(db_url, "bob"),
                 "--db", as_user(db_url, "bob"), env={"SPECREG_USER": "bob"}), 100,
             "engine_counts failed): only an unaccepted one")


ENROLLING_POLICY = POLICY_TOML + '\n[keyring]\nenrollers = ["admin", "tester"]\n'


def accept_anyway(registry, ref: str, baseline_id: int, key: str) -> None:
    """What `specreg engine-baselines accept` records, written by a modified client that skips
    its checks: the signed acceptance in its engine_accept audit event."""
    from specreg.core.signing import load_signer, sign_statement
    from specreg.registry.governance.engine_baseline_standing import ACCEPT_ACTION, ACCEPT_PREDICATE
    from specreg.registry.store.engine_baselines import baseline_of, content_sha256
    from specreg.registry.store.store import utcnow

    store, actor = registry.store, registry.user
    name, version = ref.split("@")
    with store.session(write=True) as session:
        row = store.pair_version(session, name, int(version))
        baseline = baseline_of(session, row, baseline_id)
        predicate = {"pair": name, "version": version, "binding_sha256": row.binding_sha256,
                     "engine_baseline_id": str(baseline_id), "content_sha256": content_sha256(baseline),
                     "approver": actor, "signed_at": utcnow().isoformat(timespec="microseconds"), "note": None}
        bundle = sign_statement(load_signer(key), subject_name=ref, subject_sha256=row.binding_sha256,
                                predicate_type=ACCEPT_PREDICATE, predicate=predicate)
        store.append_event(session, pair_name=name, version=int(version), action=ACCEPT_ACTION,
                           from_state=row.state.value, to_state=row.state.value, actor=actor, reason=None,
                           details={"engine_baseline_id": baseline_id, "content_sha256": content_sha256(baseline),
                                    "signature": bundle})


@pytest.mark.parametrize("registrant", ["tester", "alice"])
def test_an_enroller_cannot_accept_her_own_baseline_with_a_key_she_enrolled(db_url, tiny_models, tmp_path,
                                                                           registrant):
    """tester, an enroller, ran the engine validation (and registered the pair, or alice did). A
    key tester enrols for an invented mallory accepts nothing: `engine-baselines accept` refuses
    it, and an acceptance a modified client records anyway does not count."""
    from policyrecord import record_policy
    from specreg.api import Registry
    from specreg.core.signing import PRIVATE_KEY_FILE, PUBLIC_KEY_FILE, create_key_pair
    from specreg.golden_prompts.loader import load_golden_set
    from specreg.registry.store.engine_baselines import EngineBaselineStore

    policy = tmp_path / "policy.toml"
    policy.write_text(ENROLLING_POLICY)
    record_policy(db_url, policy, tmp_path)
    owner = Registry(as_user(db_url, registrant), user=registrant)
    ref = owner.register("pair", target=str(tiny_models["target"]), draft=str(tiny_models["draft"]),
                         num_speculative_tokens=K).version.label
    record_validation(owner, ref)
    tester = Registry(db_url, user="tester")
    baseline = EngineBaselineStore(tester.store).record(
        tester.get(ref), engine="vllm", engine_version="0.33.0", engine_build="vllm 0.33.0", source="http://x",
        golden_set="smoke", golden_sha256=load_golden_set("smoke").content_sha256, validation_run_id=None,
        report={"acceptance_reason": "alpha 0.5000 in the engine vs 0.8000 on our runtime"}, actor="tester",
        status="unaccepted", baselines={"k": K, "overall": {"acceptance_rate": 0.5, "mean_acceptance_length": 2.5}})
    create_key_pair(tmp_path / "mallory")
    enrolled = run("keys", "enrol", "mallory", "--public-key", tmp_path / "mallory" / PUBLIC_KEY_FILE,
                   "--db", db_url, "--user", "tester")
    assert enrolled.returncode == 0, enrolled.stderr
    key = str(tmp_path / "mallory" / PRIVATE_KEY_FILE)
    did = f"registered {ref}" if registrant == "tester" else f"ran engine validation {baseline.id}"
    one_line(run("engine-baselines", "accept", ref, str(baseline.id), "--key", key, "--db",
                 as_user(db_url, "mallory"), env={"SPECREG_USER": "mallory"}), 100,
             f"four-eyes: mallory's key was enrolled by tester, who {did}")
    accept_anyway(Registry(as_user(db_url, "mallory"), user="mallory"), ref, baseline.id, key)
    assert tester.engine_baseline(tester.get(ref), "vllm") is None
    listed = json.loads(run("engine-baselines", "list", ref, "--db", db_url, "--json").stdout)
    assert [(b["counts"], b["accepted_by"]) for b in listed] == [(False, None)]
    assert f"mallory's key was enrolled by tester, who {did}" in listed[0]["why"], listed[0]["why"]


def test_a_baseline_row_written_outside_specreg_counts_for_nothing(validated):
    """With the printed db grants a person may insert engine_baselines rows; one with no matching
    engine_validate event (or edited after it) is no baseline for exports or the gate."""
    from sqlalchemy import update

    from specreg.api import Registry
    from specreg.golden_prompts.loader import load_golden_set
    from specreg.registry.store.engine_baselines import EngineBaselineStore
    from specreg.registry.store.orm import EngineBaselineRow
    from specreg.registry.store.store import utcnow

    db_url, ref = validated(0.8)
    registry = Registry(db_url)
    version = registry.get(ref)
    golden = load_golden_set("smoke")
    with registry.store.session(write=True) as session:
        session.add(EngineBaselineRow(
            pair_version_id=version.id, engine="vllm", engine_version="0.33.0", engine_build="vllm 0.33.0",
            source="http://x", status="passed", golden_set="smoke", golden_sha256=golden.content_sha256,
            binding_sha256=version.binding_sha256, validation_run_id=None, actor="tester", created_at=utcnow(),
            baselines={"k": K, "overall": {"acceptance_rate": 1.0, "mean_acceptance_length": 1.000004}}, report={}))
    assert registry.engine_baseline(version, "vllm") is None
    assert "1.000004" not in run("export", ref, "--format", "vllm", "--force", "--db", db_url).stdout
    honest = EngineBaselineStore(registry.store).record(
        version, engine="vllm", engine_version="0.33.0", engine_build="vllm 0.33.0", source="http://x",
        golden_set="smoke", golden_sha256=golden.content_sha256, validation_run_id=None, report={}, actor="tester",
        baselines={"k": K, "overall": {"acceptance_rate": 0.79, "mean_acceptance_length": 3.1}})
    assert registry.engine_baseline(version, "vllm").id == honest.id
    with registry.store.session(write=True) as session:  # the figures edited afterwards
        session.execute(update(EngineBaselineRow).where(EngineBaselineRow.id == honest.id).values(
            baselines={"k": K, "overall": {"acceptance_rate": 1.0, "mean_acceptance_length": 1.000004}}))
    assert registry.engine_baseline(version, "vllm") is None
    listed = json.loads(run("engine-baselines", "list", ref, "--db", db_url, "--json").stdout)
    assert all(not b["counts"] and "no matching engine_validate event" in b["why"] for b in listed)


# --- E02: one total deadline per engine call -----------------------------------------------------

def test_a_server_trickling_a_byte_a_second_fails_within_the_deadline(validated, engine_server):
    def trickle(handler):
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", "100000")
        handler.end_headers()
        try:
            for _ in range(100000):
                handler.wfile.write(b" ")
                handler.wfile.flush()
                time.sleep(1)
        except OSError:
            pass  # specreg hung up

    db_url, ref = validated(0.5)
    server = engine_server(behave=lambda path, body: (200, {}, trickle) if path == "/v1/completions" else None)
    started = time.monotonic()
    done = validate_engine(db_url, ref, server.url, "--engine-deadline", "3")
    elapsed = time.monotonic() - started
    one_line(done, 1, f"{server.url}/v1/completions did not send its whole answer within 3 s")
    assert elapsed < 20, elapsed  # before: still reading after 150 s
    one_line(validate_engine(db_url, ref, server.url, "--engine-deadline", "nan"), 2, "invalid --engine-deadline nan")


# --- E04: every malformed answer or URL is one line ------------------------------------------------

@pytest.mark.parametrize("url", ["http://[::1", "http://a b", "http://127.0.0.1:99999", "http://:80", "http://h\x07x",
                                 "http://127.0.0.1:x"])
def test_malformed_engine_urls_are_one_line(validated, url):
    db_url, ref = validated(0.5)
    one_line(validate_engine(db_url, ref, url), 2, "engine URL")
    one_line(validate_engine(db_url, ref, "http://127.0.0.1:9", "--engine-reference-url", url), 2, "engine URL")
    one_line(run("observe", ref, "--metrics-url", url, "--db", db_url), 2, "metrics URL")


COMPLETIONS = "/v1/completions"
HOSTILE = {
    "a JSON list": (COMPLETIONS, b"[1, 2]", "answered a JSON list, not an object"),
    "not JSON": (COMPLETIONS, b"<html>", "did not answer JSON"),
    "choices a string": (COMPLETIONS, b'{"choices": "x"}', "choices is 'x', not a list"),
    "token ids NaN": (COMPLETIONS, b'{"choices": [{"token_ids": [NaN]}]}', "choices[0].token_ids[0] is nan"),
    "token id negative": (COMPLETIONS, b'{"choices": [{"token_ids": [-1]}]}', "outside 0.."),
    "token id a string": (COMPLETIONS, b'{"choices": [{"token_ids": ["7"]}]}', "is '7', not a count"),
    "finish reason a list": (COMPLETIONS, b'{"choices": [{"token_ids": [1], "finish_reason": []}]}',
                             "finish_reason is [], not a string"),
    "spec metrics NaN": (COMPLETIONS, b'{"choices": [{"token_ids": [1]}], "metrics": {"speculative_decoding": '
                         b'{"num_draft_tokens": NaN, "num_accepted_draft_tokens": 1, "num_spec_steps": 1}}}',
                         "num_draft_tokens is nan, not a whole finite number"),
    "spec metrics infinite": (COMPLETIONS, b'{"choices": [{"token_ids": [1]}], "metrics": {"speculative_decoding": '
                              b'{"num_draft_tokens": 1e999, "num_accepted_draft_tokens": 1, "num_spec_steps": 1}}}',
                              "num_draft_tokens is inf"),
    "histogram a dict": (COMPLETIONS, b'{"choices": [{"token_ids": [1]}], "metrics": {"speculative_decoding": '
                         b'{"num_draft_tokens": 1, "num_accepted_draft_tokens": 1, "num_spec_steps": 1, '
                         b'"acceptance_histogram": {"a": 1}}}}', "acceptance_histogram is {'a': 1}, not a list"),
    "version a list": ("/version", b"[]", "cannot read its identity"),
    "models data a string": ("/v1/models", b'{"data": "x"}', "cannot read its identity"),
    "metrics NaN": ("/metrics", None, "not a whole finite number"),
    "HTTP 500": (COMPLETIONS, None, "answered HTTP 500"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_malformed_engine_answer_is_one_line(validated, engine_server, case):
    path, body, message = HOSTILE[case]
    db_url, ref = validated(0.5)
    if case == "metrics NaN":
        labels = '{model_name="served"}'
        server = engine_server(metrics_text=f"vllm:spec_decode_num_drafts_total{labels} NaN\n"
                                            f"vllm:spec_decode_num_draft_tokens_total{labels} 1\n"
                                            f"vllm:spec_decode_num_accepted_tokens_total{labels} 1\n")
    elif case == "HTTP 500":
        server = engine_server(behave=lambda p, b: (500, {}, b"boom\n" * 10) if p == path else None)
    else:
        server = engine_server(behave=lambda p, b: (200, {}, body) if p == path else None)
    done = validate_engine(db_url, ref, server.url)
    one_line(done, 1, message)
    from specreg.api import Registry

    assert Registry(db_url).engine_baselines(ref) == []  # nothing recorded


@pytest.mark.parametrize("engine,body", [
    ("llamacpp", b'{"__verbose": {"tokens": [1]}, "timings": {"draft_n": NaN, "draft_n_accepted": 0}}'),
    ("llamacpp", b'{"__verbose": [], "timings": {}}'),
    ("llamacpp", b'{"__verbose": {"tokens": [1], "completion_probabilities": [{"top_logprobs": [{"id": 1, '
                 b'"logprob": NaN}]}]}}'),
    ("sglang", b'{"output_ids": [1], "meta_info": {"spec_verify_ct": 1, "spec_num_proposed_drafts": "3", '
               b'"spec_num_correct_drafts": 1}}'),
    ("sglang", b'{"output_ids": [1], "meta_info": {"spec_verify_ct": NaN}}'),
    ("sglang", b'{"output_ids": [1], "meta_info": {"output_top_logprobs": [[[NaN, 1, null]]]}}'),
    ("vllm", b'{"choices": [{"token_ids": [1], "logprobs": {"top_logprobs": [{"token_id:1": NaN}]}}]}'),
    ("vllm", b'{"choices": [{"token_ids": [1], "logprobs": {"top_logprobs": [{"token_id:' + b"9" * 5000 + b'": 0}]}}]}'),
])
def test_each_engine_reader_refuses_malformed_fields(engine_server, engine, body):
    from specreg.errors import SpecregError
    from specreg.registry.deploy.engine_client import complete

    server = engine_server(behave=lambda p, b: (200, {}, body))
    with pytest.raises(SpecregError):
        complete(engine, server.url, [1, 2], 4, top_logprobs=2, timeout=10)


# --- E05: redirects never followed to another host ---------------------------------------------------

def test_a_redirect_to_another_host_is_not_followed(validated, engine_server):
    internal = engine_server()  # what the server would like specreg to reach instead
    moved = engine_server(behave=lambda p, b: (307, {"Location": f"{internal.url}{p}"}, b""))
    db_url, ref = validated(0.5)
    done = validate_engine(db_url, ref, moved.url)
    one_line(done, 1, f"{moved.url}/version redirected (HTTP 307) to another host", "not followed")
    assert internal.hits == []
    observed = run("observe", ref, "--metrics-url", f"{moved.url}/metrics", "--interval", "1", "--db", db_url)
    one_line(observed, 1, "redirected (HTTP 307) to another host")
    assert internal.hits == []


def test_a_redirect_on_the_same_host_is_followed(engine_server):
    from specreg.registry.deploy.engine_client import http_json

    server = engine_server(behave=lambda p, b: (301, {"Location": "/version"}, b"") if p == "/old" else None)
    assert http_json(f"{server.url}/old", timeout=10) == {"version": "0.33.0"}

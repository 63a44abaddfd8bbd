"""The governance commands as a pipeline runs them: real processes, exit codes 0/100/1/2,
JSON reasons as fields, JUnit XML and Markdown outputs, a tampered audit log caught."""

from __future__ import annotations

import functools
import json
import xml.etree.ElementTree as ET

from govstate import record_validation, register_versions
from sqlalchemy import create_engine, text

from pgroles import as_user
from policyrecord import record_policy
from specreg.api import Registry

import clirun  # tests/ is on sys.path (tests/conftest.py)

# every command here runs as the registrant alice (on PostgreSQL as her role) unless it names another user
run = functools.partial(clirun.run, user="alice")


def test_gate_promote_rollback_from_the_command_line(tiny_models, policy_file, tmp_path, approval_key):
    db_url = f"sqlite:///{tmp_path / 'registry.db'}"  # the same logic runs on PostgreSQL in test_governance.py
    record_policy(db_url, policy_file, tmp_path)
    registry = Registry(as_user(db_url, "alice"), user="alice")
    v1, v2 = register_versions(registry, tiny_models, "cli", 2)
    record_validation(registry, v1)
    record_validation(registry, v2, acceptance_rate=0.5)

    junit, markdown = tmp_path / "gate.xml", tmp_path / "gate.md"
    refused = run("gate", v1, "--env", "production", "--db", db_url, "--json", "--junit", junit, "--markdown", markdown)
    assert refused.returncode == 100, refused.stderr
    data = json.loads(refused.stdout)
    assert data["passed"] is False and data["verdict"] == "refused"
    assert data["reasons"] == ["approval: production needs an approval by someone other than the registrant alice "
                               "(no signed approval counts)"]
    # the root cause in one line, with the command that fixes it; nothing on stdout but the JSON
    assert refused.stderr.splitlines() == [
        "specreg: gate refused cli@1 for production under policy of record v1: approval: production needs an "
        "approval by someone other than the registrant alice (no signed approval counts): `specreg approve cli@1 --user "
        "policy_approver --key KEY` (run by policy_approver with their enrolled private key)"]
    human = run("gate", v1, "--env", "production", "--db", db_url)
    assert human.returncode == 100 and human.stdout == "" and human.stderr == refused.stderr
    suite = ET.parse(junit).getroot().find("testsuite")
    cases = {case.get("name"): case for case in suite.iter("testcase")}
    assert len(cases) == len(data["conditions"]) == int(suite.get("tests"))
    assert suite.get("failures") == "1" and cases["approval"].find("failure") is not None
    assert cases["validation"].find("failure") is None
    assert "REFUSED" in markdown.read_text() and "| FAIL | `approval` |" in markdown.read_text()

    bob_key = approval_key(db_url, "bob")
    assert run("approve", v1, "--db", db_url, "--key", approval_key(db_url, "alice")).returncode == 100  # her own
    assert run("approve", v1, "--db", db_url, "--key", bob_key).returncode == 100  # bob's key is not alice's
    approved = run("approve", v1, "--note", "ok", "--db", db_url, "--json", "--key", bob_key, user="bob")
    assert approved.returncode == 0 and json.loads(approved.stdout)["actor"] == "bob"
    passed = run("gate", v1, "--env", "production", "--db", db_url, "--markdown", markdown)
    assert passed.returncode == 0, passed.stderr
    assert "PASS" in passed.stdout and "PASS" in markdown.read_text()

    promoted = run("promote", v1, "--to", "production", "--reason", "launch", "--db", db_url)
    assert promoted.returncode == 0 and "promoted cli@1 to production" in promoted.stdout
    held = run("gate", "cli@production", "--env", "production", "--db", db_url, "--json")
    assert held.returncode == 0 and json.loads(held.stdout)["version"] == 1
    # docs/ci.md's GitLab promote job run again (was: "already holds production: nothing to do", exit 1)
    events = len(json.loads(run("history", "cli", "--db", db_url, "--json").stdout))
    again = run("promote", v1, "--to", "production", "--reason", "re-run", "--db", db_url)
    assert again.returncode == 0, again.stderr
    assert again.stdout == "cli@1 already holds production: nothing to do (nothing changed, nothing recorded)\n"
    assert len(json.loads(run("history", "cli", "--db", db_url, "--json").stdout)) == events

    run("approve", v2, "--db", db_url, "--key", bob_key, user="bob")
    worse = run("promote", v2, "--to", "production", "--db", db_url)
    assert worse.returncode == 100
    (headline,) = worse.stderr.splitlines()  # one reason, with the command that fixes it
    assert headline.startswith(f"specreg: cannot promote cli@2 to production under policy of record v1: acceptance: "
                               "acceptance_rate 0.500 < 0.720 (production holder cli@1")
    assert "`specreg validate cli@2 --golden smoke` (to measure again; or register a draft closer to the target: " \
           f"specreg register cli --target {tiny_models['target']}" in headline
    assert run("promote", v2, "--to", "staging", "--db", db_url).returncode == 0
    stale = run("promote", v1, "--to", "staging", "--expect", "none", "--db", db_url)
    assert stale.returncode == 1 and "cli@staging is now held by version 2" in stale.stderr
    assert run("promote", v1, "--to", "staging", "--expect", "2", "--db", db_url).returncode == 0
    back = run("rollback", "cli", "--env", "staging", "--db", db_url, "--json")
    assert back.returncode == 0 and json.loads(back.stdout) == {
        "pair": "cli", "environment": "staging", "version": 2, "previous_version": 1, "action": "rollback"}

    envs = json.loads(run("env", "list", "cli", "--db", db_url, "--json").stdout)
    assert {(e["environment"], e["version"]) for e in envs} == {("production", 1), ("staging", 2)}
    refused_retire = run("retire", v1, "--db", db_url)
    assert refused_retire.returncode == 100 and "cli@1 holds production" in refused_retire.stderr
    diff = run("diff", v1, v2, "--db", db_url)
    assert diff.returncode == 0 and "num_speculative_tokens" in diff.stdout and "acceptance_rate" in diff.stdout
    verify = run("audit", "verify", "--db", db_url)
    assert verify.returncode == 0 and "audit log intact" in verify.stdout


def test_gate_fails_closed_and_usage_errors(tmp_path, tiny_models, policy_file):
    db_url = f"sqlite:///{tmp_path / 'registry.db'}"
    record_policy(db_url, policy_file, tmp_path)
    registry = Registry(as_user(db_url, "alice"), user="alice")
    (ref,) = register_versions(registry, tiny_models, "fc", 1)
    record_validation(registry, ref)
    assert run("gate", ref, "--env", "staging", "--db", db_url).returncode == 0

    unknown_env = run("gate", ref, "--env", "prod", "--db", db_url, "--json")
    assert unknown_env.returncode == 1 and "unknown environment 'prod'" in unknown_env.stderr
    assert json.loads(unknown_env.stdout)["error"].startswith("unknown environment 'prod'")

    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not a database" * 100)
    junit = tmp_path / "error.xml"
    unreadable = run("gate", ref, "--env", "staging", "--db", f"sqlite:///{garbage}", "--junit", junit)
    assert unreadable.returncode == 1 and unreadable.stderr.count("\n") == 1
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite.get("errors") == "1" and suite.find("testcase/error") is not None

    # a run edited in the database no longer hashes to what its validate event recorded: it counts
    # for nothing, and the gate refuses on that (it no longer reads the garbage at all)
    engine = create_engine(db_url)
    with engine.begin() as connection:
        connection.execute(text("""UPDATE validation_runs SET baselines = '{"overall": "garbage"}'"""))
    engine.dispose()
    edited = run("gate", ref, "--env", "staging", "--db", db_url, "--json")
    assert edited.returncode == 100, edited.stderr
    assert "validation: fc@1 is not validated on golden set smoke (no validation run yet)" \
        in json.loads(edited.stdout)["reasons"]

    bad_policy = tmp_path / "bad.toml"
    bad_policy.write_text("[environments.production]\naproval_required = true\n")
    typo = run("gate", ref, "--env", "production", "--db", db_url, "--policy", bad_policy)
    assert typo.returncode == 2 and "unknown key 'environments.production.aproval_required'" in typo.stderr
    assert run("gate", "fc@@1", "--env", "staging", "--db", db_url).returncode == 2
    assert run("gate", ref, "--db", db_url).returncode == 2  # --env missing


def test_audit_verify_catches_an_edited_and_a_deleted_event(db_url, tiny_models, policy_file):
    registry = Registry(as_user(db_url, "alice"), user="alice")
    (ref,) = register_versions(registry, tiny_models, "au", 1)
    record_validation(registry, ref)
    registry.promote(ref, "staging")
    assert run("audit", "verify", "--db", db_url).returncode == 0
    engine = create_engine(db_url)
    with engine.begin() as connection:
        connection.execute(text("UPDATE audit_events SET reason = 'nothing to see' WHERE id = 2"))
    edited = run("audit", "verify", "--db", db_url, "--json")
    assert edited.returncode == 1 and "event 2: content does not match its hash" in edited.stderr
    assert {k: v for k, v in json.loads(edited.stdout).items() if k not in ("head", "not_counted")} == {
        "intact": False, "checked": 1,
                                         "problem": "event 2: content does not match its hash (the row was edited)"}
    with engine.begin() as connection:
        connection.execute(text("UPDATE audit_events SET reason = NULL WHERE id = 2"))
    # SQLite: the edit undone, the chain verifies; PostgreSQL: the server stamped the editor's role
    # on the row, so even an undone edit stays visible
    assert run("audit", "verify", "--db", db_url).returncode == (1 if "postgresql" in db_url else 0)
    with engine.begin() as connection:
        connection.execute(text("DELETE FROM audit_events WHERE id = 2"))
    deleted = run("audit", "verify", "--db", db_url)
    assert deleted.returncode == 1 and deleted.stderr.count("\n") == 1
    assert "event 3: prev_hash does not match the event before it" in deleted.stderr
    engine.dispose()


def test_a_run_on_another_golden_set_is_the_root_cause_and_nothing_it_met_is_listed_unmet(tmp_path, tiny_models,
                                                                                          monkeypatch, approval_key):
    monkeypatch.delenv("SPECREG_POLICY", raising=False)  # the built-in policy: production asks for `default`
    db_url = f"sqlite:///{tmp_path / 'registry.db'}"
    alice = Registry(db_url, user="alice")
    (ref,) = register_versions(alice, tiny_models, "first", 1)
    record_validation(alice, ref, golden="smoke", acceptance_rate=0.8, speedup=1.5)  # every check passed there
    junit = tmp_path / "gate.xml"
    refused = run("gate", ref, "--env", "production", "--db", db_url, "--json", "--junit", junit)
    data = json.loads(refused.stdout)
    assert refused.returncode == 100
    assert data["reasons"] == [
        "validation: run 1 used golden set smoke; the policy asks for default",
        "approval: production needs an approval by someone other than the registrant alice (no signed approval "
        "counts)"]
    waiting = {c["name"] for c in data["conditions"] if not c["passed"]} - {"validation", "approval"}
    assert waiting == {"golden_set", "validation_age", "check.integrity", "check.tokenizer", "check.chat_template",
                       "check.equivalence", "check.acceptance",
                       "baselines", "acceptance", "min_acceptance", "speedup"}
    assert all(c["reason"] == "not judged: needs a passed validation on golden set default"
               for c in data["conditions"] if c["name"] in waiting)
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite.get("failures") == "2" and suite.get("skipped") == str(len(waiting))
    lines = refused.stderr.splitlines()
    assert lines[0] == ("specreg: gate refused first@1 for production under built-in default (no policy of record yet): validation: run 1 "
                        "used golden set smoke; the policy asks for default: `specreg validate first@1 --golden "
                        "default`")
    assert lines[1:] == [
        "also unmet (1):",
        "  - approval: production needs an approval by someone other than the registrant alice (no signed approval "
        "counts)",
        "    fix: specreg approve first@1 --user PERSON --key KEY (by someone other than the registrant, with a key "
        "enrolled by `specreg keys enrol`)"]
    promote = run("promote", ref, "--to", "production", "--db", db_url, "--json")
    assert promote.returncode == 100 and json.loads(promote.stdout)["reasons"] == data["reasons"]
    assert promote.stderr.splitlines()[0].startswith("specreg: cannot promote first@1 to production under built-in "
                                                     "default (no policy of record yet): validation: run 1 used")

    # once an approver is enrolled the fix names them; a slow pair's fix is the k its validation recommends
    approval_key(db_url, "bob")
    (slow,) = register_versions(alice, tiny_models, "slow", 1)
    record_validation(alice, slow, golden="default", acceptance_rate=0.8, speedup=0.7, recommended_k=3,
                      checks={name: "pass" for name in ("integrity", "tokenizer", "chat_template", "equivalence",
                                                        "acceptance")})
    lines = run("gate", slow, "--env", "production", "--db", db_url).stderr.splitlines()
    assert lines[0].startswith("specreg: gate refused slow@1 for production under built-in default (no policy of record yet): speedup: "
                               "0.70x at k=1 < 1x (min_speedup): slower than the target alone: `specreg register "
                               f"slow --target {tiny_models['target']} --draft {tiny_models['draft']} "
                               "--num-speculative-tokens 3` (the k its validation recommends;")
    assert "    fix: specreg approve slow@1 --user bob --key KEY (run by bob with their enrolled private key)" in lines


def test_a_slow_pair_whose_best_k_cannot_reach_the_floor_is_told_so(tmp_path, tiny_models, monkeypatch):
    """The real pair's case: 0.41x at k=4, the best k (1) expected at about 0.83x because the draft
    costs as much as the target (c 1.04). No k reaches the 1x floor, so the refusal says so and
    names the ways out instead of sending the user to validate k=1 (which is refused again); where
    the recommended k is expected to reach the floor, that k is the fix, with its expectation."""
    monkeypatch.delenv("SPECREG_POLICY", raising=False)  # the built-in policy: production needs 1x
    db_url = f"sqlite:///{tmp_path / 'registry.db'}"
    alice = Registry(db_url, user="alice")
    checks = {name: "pass" for name in ("integrity", "tokenizer", "chat_template", "equivalence", "acceptance")}
    hopeless, hopeful = register_versions(alice, tiny_models, "same", 1)[0], register_versions(alice, tiny_models,
                                                                                                "deep", 1)[0]
    record_validation(alice, hopeless, golden="default", speedup=0.41, recommended_k=1, expected_speedup=0.83,
                      cost_ratio=1.04, checks=checks)
    record_validation(alice, hopeful, golden="default", speedup=0.7, recommended_k=3, expected_speedup=1.6,
                      cost_ratio=0.1, checks=checks)
    reasons = {c.name: c.reason for c in alice.gate(hopeless, "production").conditions if not c.passed}
    assert reasons["speedup"] == ("0.41x at k=1 < 1x (min_speedup): slower than the target alone; no k reaches 1x: "
                                  "the best, k=1, is expected at about 0.83x (the draft costs as much as the "
                                  "target: c ≈ 1.04)")
    first = run("promote", hopeless, "--to", "production", "--db", db_url).stderr.splitlines()[0]
    assert first.endswith(
        "`specreg promote same@1 --to production --allow-slower REASON` (an exception recorded in the audit log; "
        "or what can reach the floor: a smaller draft (`specreg register same --target "
        f"{tiny_models['target']} --draft SMALLER_DRAFT`) or a head trained on the target "
        "(`--method eagle3 --draft HEAD`))"), first
    assert "--num-speculative-tokens" not in first
    first = run("promote", hopeful, "--to", "production", "--db", db_url).stderr.splitlines()[0]
    assert "no k reaches" not in first
    assert first.endswith(f"--draft {tiny_models['draft']} --num-speculative-tokens 3` (the k its validation "
                          "recommends, expected about 1.60x; or promote --allow-slower REASON, an exception "
                          "recorded in the audit log)"), first

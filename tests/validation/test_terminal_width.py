"""The CLI in a real pseudo-terminal 100 columns wide: every command's human output fits, errors,
refusals, progress and help included, along a whole chain (register -> validate -> refused and
allowed promotes with an exception -> keys -> export -> verify -> gate -> inspection). The chain
and the helps run in one interpreter on the pty (terminal.cli_chain_in_terminal); the top-level
help runs as its own `python -m specreg.cli` process."""

from __future__ import annotations

import os
import shlex

import pytest

from terminal import cli_chain_in_terminal, in_terminal

COLUMNS = 100

POLICY = """\
golden_set = "smoke"
required_checks = ["integrity", "tokenizer", "equivalence", "acceptance"]
[environments.staging]
[environments.production]
approval_required = true
min_speedup = 50.0   # beyond any tiny pair: the promote needs --allow-slower, whose notice must fit too
"""


def assert_fits(lines: list[str]) -> None:
    wide = [line for line in lines if len(line) > COLUMNS]
    assert not wide, f"{len(wide)} line(s) wider than {COLUMNS} columns: {wide[:3]}"


@pytest.mark.slow
def test_every_command_fits_a_100_column_terminal(tiny_models, tmp_path):
    from policyrecord import record_policy

    (tmp_path / "policy.toml").write_text(POLICY)
    (tmp_path / "home").mkdir()
    record_policy(f"sqlite:///{tmp_path / 'home' / 'registry.db'}", tmp_path / "policy.toml", tmp_path)
    env = {**os.environ, "SPECREG_HOME": str(tmp_path / "home"), "SPECREG_USER": "alice", "OMP_NUM_THREADS": "1",
           "TERM": "xterm"}
    env.pop("COLUMNS", None)
    target, draft = shlex.quote(str(tiny_models["target"])), shlex.quote(str(tiny_models["draft"]))
    reason = ("the product team accepts a slower pair for this launch because latency is not the goal and "
              "the draft is kept for its acceptance figures")
    # the chain on the terminal; `|| true` where a command is meant to refuse or fail
    steps = f"""
    specreg register wide --target {target} --draft {draft} -k 3
    specreg register wide --target {target} --draft {draft} -k 2
    specreg list
    specreg validate wide@1 --device cpu
    specreg validate wide@2 --device cpu --checks integrity,tokenizer,equivalence,acceptance,performance
    specreg gate wide@1 --env production || true
    specreg promote wide@1 --to production || true
    specreg promote wide@1 --to staging
    specreg keys create --out keys/bob --use approval
    specreg keys create --out keys/team --use lock
    specreg keys create --out keys/any
    specreg keys enrol bob --public-key keys/bob/specreg-signing.pub --user admin
    specreg keys list
    specreg approve wide@1 --user bob --key keys/bob/specreg-signing.key
    specreg promote wide@1 --to production --allow-slower "{reason}"
    specreg history wide
    specreg show wide@1
    specreg diff wide@1 wide@2
    specreg env list
    specreg env history wide --env production
    specreg policy show
    specreg policy history
    specreg export wide@production --format vllm -o deploy --signing-key keys/team/specreg-signing.key
    specreg export wide@production --format k8s-vllm -o k8s || true
    specreg keys export --out deploy/keyring.json
    specreg verify --lock deploy/specreg.lock.json --public-key keys/team/specreg-signing.pub \\
      --keyring deploy/keyring.json --target {target} --draft {draft}
    specreg verify --lock deploy/specreg.lock.json --public-key keys/team/specreg-signing.pub \\
      --keyring deploy/keyring.json --target {draft} --draft {draft} || true
    specreg gate wide@production --env production --junit gate.xml
    specreg gate wide@production --env production --policy {shlex.quote(str(tmp_path / "policy.toml"))} || true
    specreg policy show --policy {shlex.quote(str(tmp_path / "policy.toml"))}
    specreg reject wide@2 --user bob --key keys/bob/specreg-signing.key --note "{reason}"
    specreg promote wide@2 --to staging
    specreg rollback wide --env staging
    specreg retire wide@2 --reason "{reason}"
    specreg db upgrade
    specreg audit verify
    specreg audit verify --expect-head {"0" * 64} || true
    specreg show nope@1 || true
    specreg promote wide@2 --to nowhere || true
    """
    work = tmp_path / "work"
    work.mkdir()
    code, lines = cli_chain_in_terminal(steps, env, work)
    assert code == 0 and lines[-1] == "CHAIN-DONE", lines[-20:]
    assert_fits(lines)
    text = "\n".join(lines)
    assert "decoding golden prompts" in text and "check integrity" in text  # progress on the terminal
    assert any(line.startswith("specreg: gate refused wide@1 for production") for line in lines)
    assert "EXCEPTION recorded in the audit log" in text and "latency is not the goal" in text
    assert "gate wide@1 -> production: PASS" in text and "verified wide@1" in text


def test_top_level_help_summaries_are_whole_and_fit(tmp_path):
    env = {**os.environ, "SPECREG_HOME": str(tmp_path / "home"), "TERM": "xterm"}
    env.pop("COLUMNS", None)
    code, lines = in_terminal(["--help"], env)
    assert code == 0
    assert_fits(lines)
    commands = lines[lines.index("Commands:") + 1:]
    assert not [line for line in commands if line.rstrip().endswith("...")]  # click cut them at ~45 characters
    text = " ".join(" ".join(commands).split())
    assert "validate Validate a pair version on golden prompts; exit 0 pass, 100 a check failed, 1 error." in text


@pytest.mark.slow
def test_every_command_help_fits(tmp_path):
    env = {**os.environ, "SPECREG_HOME": str(tmp_path / "home"), "TERM": "xterm"}
    env.pop("COLUMNS", None)
    from specreg.cli import cli

    names = []
    for name, command in cli.commands.items():
        names += [f"{name} {sub}" for sub in getattr(command, "commands", {})] or [name]
    code, lines = cli_chain_in_terminal("".join(f"specreg {name} --help\n" for name in names), env, tmp_path)
    assert code == 0 and lines[-1] == "CHAIN-DONE", lines[-5:]
    assert_fits(lines)
    assert sum(line.startswith("Usage: ") for line in lines) == len(names)

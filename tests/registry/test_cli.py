"""The CLI as a user runs it: real processes, real databases, one-line errors, exit codes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from pgroles import as_user

from clirun import SPECREG, one_line, run, run_process  # tests/ is on sys.path (tests/conftest.py)


def test_register_list_show_history(db_url, tiny_models):
    registered = run_process("register", "chat", "--target", tiny_models["target"], "--draft", tiny_models["draft"],
                             "-k", "4", "--notes", "first cut", "--db", as_user(db_url, "carol"), "--user", "carol",
                             "--json")
    assert registered.returncode == 0, registered.stderr
    data = json.loads(registered.stdout)
    assert data["created"] is True and data["version"] == 1 and data["registered_by"] == "carol"

    again = run_process("register", "chat", "--target", tiny_models["target"], "--draft", tiny_models["draft"],
                        "-k", "4", "--db", db_url)
    assert again.returncode == 0 and "already registered as chat@1" in again.stdout

    listing = run_process("list", "--db", db_url, "--json")
    assert [(r["name"], r["version"], r["state"], r["environments"]) for r in json.loads(listing.stdout)] == [
        ("chat", 1, "registered", [])]
    table = run_process("list", "--db", db_url).stdout.splitlines()
    assert table[0].split() == ["PAIR", "VERSION", "STATE", "HOLDS", "METHOD", "K", "BY", "REGISTERED", "(UTC)"]
    assert table[2].split()[:5] == ["chat", "1", "registered", "-", "draft_model"]

    shown = json.loads(run_process("show", "chat@1", "--db", db_url, "--json").stdout)
    assert shown["target"]["fingerprint"]["weights_sha256"] == data["target"]["fingerprint"]["weights_sha256"]
    assert shown["config"]["num_speculative_tokens"] == 4
    assert [e["action"] for e in shown["events"]] == ["register"]
    human = run_process("show", "chat", "--db", db_url).stdout
    assert "chat@1  state registered" in human and "chat template" in human and "holds: no environment" in human

    history = json.loads(run_process("history", "chat", "--db", db_url, "--json").stdout)
    assert [(e["action"], e["actor"], e["reason"]) for e in history] == [("register", "carol", "first cut")]


def test_user_errors_are_one_line(db_url, tiny_models, tmp_path):
    target = tiny_models["target"]
    one_line(run("register", "x", "--target", tmp_path / "missing", "--draft", target, "-k", "4", "--db", db_url),
             1, "missing: no such directory")
    (tmp_path / "empty").mkdir()
    one_line(run("register", "x", "--target", tmp_path / "empty", "--draft", target, "-k", "4", "--db", db_url),
             1, "empty: no config.json")
    no_tokenizer = tmp_path / "no-tokenizer"
    shutil.copytree(tiny_models["draft"], no_tokenizer)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (no_tokenizer / name).unlink()
    one_line(run("register", "x", "--target", target, "--draft", no_tokenizer, "-k", "4", "--db", db_url),
             1, "no-tokenizer: no tokenizer files")
    corrupt = tmp_path / "corrupt"
    shutil.copytree(tiny_models["draft"], corrupt)
    (corrupt / "model.safetensors").write_bytes(b"\x00" * 4)
    one_line(run("register", "x", "--target", target, "--draft", corrupt, "-k", "4", "--db", db_url),
             1, "model.safetensors: corrupt safetensors header")
    one_line(run("register", "Bad Name", "--target", target, "--draft", target, "-k", "4", "--db", db_url),
             2, "invalid pair name 'Bad Name'")
    one_line(run("register", "x", "--target", target, "--draft", target, "-k", "0", "--db", db_url),
             2, "num_speculative_tokens 0")
    one_line(run("show", "nothing@3", "--db", db_url), 1, "unknown pair nothing")
    # nothing half-written by any of the failures above
    assert json.loads(run("list", "--db", db_url, "--json").stdout) == []


def test_unreachable_database_is_one_line():
    result = run_process("list", "--db", "postgresql+psycopg://nobody@127.0.0.1:9/none")
    one_line(result, 1, "database postgresql+psycopg://nobody@127.0.0.1:9/none")
    result = run_process("list", "--db", "not a url")
    one_line(result, 1, "not a valid SQLAlchemy URL")


def test_missing_required_option_is_usage_error():
    result = run_process("register", "x")
    assert result.returncode == 2 and "--target" in result.stderr


@pytest.mark.parametrize("args", [["--help"], ["list"], ["show", "chat@1"]])
def test_light_commands_import_no_heavy_library(args, tmp_path, tiny_models):
    db = f"sqlite:///{tmp_path / 'r.db'}"
    run("register", "chat", "--target", tiny_models["target"], "--draft", tiny_models["draft"], "-k", "2", "--db", db)
    probe = (
        "import sys\n"
        "from specreg.cli import main\n"
        f"sys.argv = ['specreg'] + {args!r} + ([] if {args!r} == ['--help'] else ['--db', {db!r}])\n"
        "try:\n    main()\nexcept SystemExit as exit:\n    assert exit.code in (0, None), exit.code\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'mlflow') if m in sys.modules)\n"
        "print('HEAVY', heavy)\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "HEAVY []" in result.stdout


def test_the_process_entry_exits_with_the_collector_frozen(tmp_path):
    """`specreg` (specreg.cli.run) ends with gc.freeze, so the interpreter's exit does not walk
    torch's and transformers' objects; the exit code and the atexit handlers stay as they were."""
    probe = (
        "import atexit, gc, sys\n"
        "atexit.register(lambda: print('FROZEN', gc.get_freeze_count() > 0, flush=True))\n"
        "from specreg.cli import run\n"
        f"sys.argv = ['specreg', 'show', 'nope@1', '--db', 'sqlite:///{tmp_path / 'r.db'}']\n"
        "run()\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "FROZEN True" in result.stdout, (result.returncode, result.stderr)
    assert result.stderr.startswith("specreg: error:") and "Traceback" not in result.stderr


def test_diff_keeps_both_versions_side_by_side_in_100_columns(tmp_path, tiny_models):
    """Long values (model paths) on both sides: each version's value wraps within its own column,
    and each row's second value starts on the row's own line, never alone on the lines below."""
    db_url = f"sqlite:///{tmp_path / 'registry.db'}"
    deep = tmp_path / "a-rather-long-folder-name-for-the-models" / "and-another-level-below-it"
    target, draft = (shutil.copytree(tiny_models[name], deep / name) for name in ("target", "draft"))
    run("register", "wide", "--target", target, "--draft", draft, "-k", "3", "--db", db_url)
    run("register", "wide", "--target", target, "--draft", target, "-k", "2", "--db", db_url)
    shown = run("diff", "wide@1", "wide@2", "--db", db_url, env={"COLUMNS": "100"})
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert max(len(line) for line in lines) <= 100, lines
    a_column, b_column = lines[0].index("WIDE@1"), lines[0].index("WIDE@2")
    rows = [index for index, line in enumerate(lines) if line.startswith(("=", "≠"))]
    assert [lines[index].split()[1:3] for index in rows] == [
        ["version", "binding_sha256"], ["draft", "reference"], ["draft", "weights_sha256"],
        ["draft", "config_sha256"], ["draft", "parameter_count"], ["config", "num_speculative_tokens"]]
    for index in rows:  # the second version's value begins on its row's own line
        assert lines[index][b_column:].strip(), lines
    # the reference row continues on the lines below it, each value in its own column
    reference = rows[1]
    continued = lines[reference:rows[2]]
    assert "".join(line[a_column:b_column].strip() for line in continued) == str(draft)
    assert "".join(line[b_column:].strip() for line in continued) == str(target)

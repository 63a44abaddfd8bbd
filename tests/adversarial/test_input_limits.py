"""Inputs past what a field can hold: a version number
past the database's integers, a time that leaves the calendar once converted to UTC, a key file
position held by a dangling symlink, a path component over the file system's 255 bytes. Each is
one line on stderr, exit 1 or 2, no traceback, nothing written; the store cases run on SQLite
and PostgreSQL (conftest's db_url; the refusals of a reference on one registry per store).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from clirun import one_line, run_specreg  # tests/ is on sys.path (tests/conftest.py)
from helpers import isolate_environment
from pgroles import fresh_database

LONG = "a" * 300  # one path component; Linux file systems hold 255 bytes


def register_p(db_url: str, tiny_models) -> str:
    result = run_specreg(["register", "p", "--target", tiny_models["target"], "--draft", tiny_models["draft"],
                          "-k", "3", "--db", db_url])
    assert result.returncode == 0, result.stderr
    return db_url


@pytest.fixture
def registered(db_url, tiny_models) -> str:
    """A registry of this test's own with p@1: for the tests that check what a refusal left behind."""
    return register_p(db_url, tiny_models)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def registered_once(request, tmp_path_factory, tiny_models, postgres_available) -> str:
    """A registry per store with p@1, shared by the refusal tests of this file: each is refused
    before it reads a version or writes a row, so one registration serves them all (a registration
    per test was most of this file's time)."""
    root = tmp_path_factory.mktemp("input-limits")
    if request.param == "sqlite":
        with pytest.MonkeyPatch.context() as patch:
            isolate_environment(patch, root / "specreg-home")
            yield register_p(f"sqlite:///{root / 'registry.db'}", tiny_models)
        return
    if not postgres_available:
        pytest.skip("PostgreSQL is not reachable (set CI=true to make this a failure)")
    with fresh_database() as url, pytest.MonkeyPatch.context() as patch:
        isolate_environment(patch, root / "specreg-home")
        yield register_p(url, tiny_models)


# --- MED-6: NAME@VERSION past 64 bits (was: OverflowError from SQLite, NumericValueOutOfRange from
# PostgreSQL's INTEGER already past 2**31 - 1, ValueError from int('²')) ------------------------

@pytest.mark.parametrize("version", [str(2**64), str(2**63), str(2**31), "v" + str(2**64), "9" * 5000])
@pytest.mark.parametrize("command", [["show"], ["approve"], ["reject"], ["retire"], ["diff", "p@1"],
                                     ["export", "--format", "vllm", "--force"], ["gate", "--env", "staging"],
                                     ["promote", "--to", "staging"], ["validate", "--golden", "smoke"]])
def test_a_version_past_the_database_integers_is_one_line(registered_once, command, version):
    result = run_specreg([command[0], f"p@{version}", *command[1:], "--db", registered_once])
    one_line(result, 2, "invalid version in 'p@", "past the largest version number, 2147483647")


@pytest.mark.parametrize("selector", ["²", "٣", "v²"])
def test_a_version_in_other_digits_is_not_a_version(registered_once, selector):
    # str.isdigit() said yes to these; int('²') raised and int('٣') quietly read version 3
    result = run_specreg(["show", f"p@{selector}", "--db", registered_once])
    one_line(result, 2, "invalid reference 'p@", "expected NAME, NAME@VERSION or NAME@ENVIRONMENT")


def test_an_expected_holder_past_the_database_integers_is_one_line(registered_once):
    result = run_specreg(["promote", "p@1", "--to", "staging", "--expect", str(2**64), "--db", registered_once])
    one_line(result, 2, f"invalid version in --expect '{2**64}': past the largest version number")


def test_the_largest_version_is_still_asked_for(registered_once):
    result = run_specreg(["show", f"p@{2**31 - 1}", "--db", registered_once])
    one_line(result, 1, f"p@{2**31 - 1}")  # not found: the database was asked, and said no


# --- MED-8: a time that leaves years 1..9999 in UTC (was: OverflowError: date value out of range) --

@pytest.mark.parametrize("at", ["0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00"])
def test_env_history_at_a_time_outside_the_calendar_in_utc(registered_once, at):
    result = run_specreg(["env", "history", "p", "--env", "staging", "--at", at, "--db", registered_once])
    one_line(result, 2, f"invalid time '{at}': outside the years 1 to 9999 once converted to UTC")


# --- LOW-3: keys create onto a dangling symlink (was: FileExistsError from os.open(O_EXCL) or mkdir) --

def test_keys_create_refuses_a_dangling_symlink_where_the_key_goes(tmp_path):
    keys = tmp_path / "keys"
    keys.mkdir()
    os.symlink(tmp_path / "elsewhere" / "stolen.key", keys / "specreg-signing.key")
    result = run_specreg(["keys", "create", "--out", keys])
    one_line(result, 1, f"{keys / 'specreg-signing.key'} is a symlink to {tmp_path / 'elsewhere' / 'stolen.key'}; "
                        "refusing to overwrite a signing key")
    assert sorted(p.name for p in keys.iterdir()) == ["specreg-signing.key"]
    assert not (tmp_path / "elsewhere").exists()


def test_keys_create_refuses_an_out_folder_that_is_a_dangling_symlink(tmp_path):
    os.symlink(tmp_path / "gone", tmp_path / "keys")
    result = run_specreg(["keys", "create", "--out", tmp_path / "keys"])
    one_line(result, 2, f"--out {tmp_path / 'keys'}: a symlink to {tmp_path / 'gone'}, which does not exist")
    assert not (tmp_path / "gone").exists()


# --- LOW-4: a path component over 255 bytes (was: OSError [Errno 36] File name too long) ------------

def test_an_output_path_component_over_255_bytes_is_one_line(registered, tmp_path):
    """Was: OSError [Errno 36] from pathlib, or for out/LONG/x "cannot write ...: File name too
    long" after out/ had been created."""
    work = tmp_path / "work"
    work.mkdir()
    for args in (["export", "p@1", "--format", "vllm", "--force", "-o", LONG, "--db", registered],
                 ["export", "p@1", "--format", "vllm", "--force", "-o", f"out/{LONG}/x", "--db", registered],
                 ["validate", "p@1", "--golden", "smoke", "--checks", "integrity", "--report", f"{LONG}.html",
                  "--db", registered],
                 ["keys", "create", "--out", f"k/{LONG}"]):
        result = run_specreg(args, cwd=work)
        one_line(result, 2, "path too long for the file system (longest component 30")
    assert os.listdir(work) == []  # nothing half-written
    events = json.loads(run_specreg(["history", "p", "--json", "--db", registered]).stdout)
    assert [event["action"] for event in events] == ["register"]  # no validation was started


def test_an_input_path_component_over_255_bytes_is_one_line(registered, tmp_path, tiny_models):
    for args in (["register", "q", "--target", tmp_path / LONG, "--draft", tiny_models["draft"], "-k", "3",
                  "--db", registered],
                 ["validate", "p@1", "--golden", tmp_path / f"{LONG}.yaml", "--db", registered]):
        result = run_specreg(args)
        one_line(result, 2, "path too long for the file system (longest component 30")

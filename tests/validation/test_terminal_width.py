"""The CLI in a real pseudo-terminal 100 columns wide (issue 22): what validate, gate and a refused
promote print fits, progress included; refusals give one reason a line, each with its fix."""

from __future__ import annotations

import os
import subprocess

import pytest

from clirun import SPECREG
from terminal import in_terminal

COLUMNS = 100


def assert_fits(lines: list[str]) -> None:
    wide = [line for line in lines if len(line) > COLUMNS]
    assert not wide, f"{len(wide)} line(s) wider than {COLUMNS} columns: {wide[:3]}"


@pytest.mark.slow
def test_validate_gate_and_a_refused_promote_fit_100_columns(tiny_models, tmp_path):
    env = {**os.environ, "SPECREG_HOME": str(tmp_path / "home"), "SPECREG_USER": "alice", "OMP_NUM_THREADS": "1",
           "TERM": "xterm"}
    env.pop("COLUMNS", None)
    registered = subprocess.run(SPECREG + ["register", "wide", "--target", tiny_models["target"], "--draft",
                                           tiny_models["draft"], "-k", "3"], env=env, capture_output=True, text=True)
    assert registered.returncode == 0, registered.stderr

    code, lines = in_terminal(["validate", "wide@1", "--golden", "smoke", "--device", "cpu"], env)
    assert code in (0, 100), lines
    assert_fits(lines)
    text = "\n".join(lines)
    assert "CHECK" in text and "SUMMARY" in text and "wide@1: validation run 1" in text
    assert "decoding golden prompts" in text and "check integrity" in text  # progress on the terminal
    summaries = [line for line in lines if line.startswith("performance ")]
    assert summaries and len(summaries[0]) <= COLUMNS  # the long summary is wrapped under its row

    code, lines = in_terminal(["gate", "wide@1", "--env", "production"], env)
    assert code == 100
    assert_fits(lines)
    assert any(line.startswith("specreg: gate refused wide@1 for production:") for line in lines)

    code, lines = in_terminal(["promote", "wide@1", "--to", "production"], env)
    assert code == 100
    assert_fits(lines)
    start = next(i for i, line in enumerate(lines) if line.startswith("specreg: cannot promote wide@1 to production"))
    refusal = lines[start + 1:]
    reasons = [line for line in refusal if line.startswith("  - ")]
    fixes = [line for line in refusal if line.startswith("    fix: ")]
    # the built-in policy: validated on smoke, not default; no approval; each with its own fix
    assert any(line.startswith("  - validation: wide@1 is not validated on golden set default") for line in reasons)
    assert any(line.startswith("  - approval: ") for line in reasons)
    assert "    fix: specreg validate wide@1 --golden default" in fixes
    assert len(fixes) == len(reasons) and all(line.startswith(("  - ", "    ", "      ")) for line in refusal)


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

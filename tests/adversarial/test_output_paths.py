"""Files specreg writes where a user (or a checkout) names them: a report, a keyring, step outputs.
Before the fix, a symlink at the path, dangling or not, was written through (`keys export --out`,
`gate --junit/--markdown`, `ci-outputs --output/--summary`, `validate --report`): a merge request
that commits `gate.md` as a link to `~/.bashrc` had the gate's report land there. Now each is
written to a fresh file (specreg.core.files.write_fresh), or appended to a regular file without
following a link (append_text, for $GITHUB_OUTPUT), and a link in its place is one line, exit
1 or 2, nothing written where it points.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from clirun import one_line, run_specreg  # tests/ is on sys.path (tests/conftest.py)


@pytest.fixture(scope="module")
def registry(tmp_path_factory, tiny_models) -> str:
    """A SQLite registry with p@1 (whether a link is followed does not depend on the store)."""
    url = f"sqlite:///{tmp_path_factory.mktemp('outputs') / 'registry.db'}"
    result = run_specreg(["register", "p", "--target", tiny_models["target"], "--draft", tiny_models["draft"],
                          "-k", "3", "--db", url])
    assert result.returncode == 0, result.stderr
    return url


@pytest.fixture
def gate_json(registry, tmp_path) -> Path:
    path = tmp_path / "gate.json"
    path.write_text(run_specreg(["gate", "p@1", "--env", "staging", "--json", "--db", registry]).stdout)
    return path


def commands(registry: str, gate_json: Path, link: Path) -> list[tuple[list, int, str]]:
    """(argv that writes ``link``, exit code, option named in the error)."""
    db = ["--db", registry]
    return [
        (["keys", "export", "--out", link, *db], 1, "keyring"),
        (["gate", "p@1", "--env", "staging", "--junit", link, *db], 1, "--junit"),
        (["gate", "p@1", "--env", "staging", "--markdown", link, *db], 1, "--markdown"),
        (["ci-outputs", gate_json, "--style", "github", "--output", link], 1, "--output"),
        (["ci-outputs", gate_json, "--style", "dotenv", "--output", link], 1, "--output"),
        (["ci-outputs", gate_json, "--style", "github", "--markdown", gate_json, "--summary", link], 1, "--summary"),
        (["validate", "p@1", "--golden", "smoke", "--report", link, *db], 2, "--report"),
        (["validate", "p@1", "--golden", "smoke", "--markdown", link, *db], 2, "--markdown"),
    ]


@pytest.mark.parametrize("dangling", [True, False], ids=["dangling", "to-a-file"])
def test_no_output_path_writes_through_a_symlink(registry, gate_json, tmp_path, dangling):
    victim = tmp_path / "etc" / "victim"
    victim.parent.mkdir()
    if not dangling:
        victim.write_text("keep me\n")
    link = tmp_path / "report"
    os.symlink(victim, link)
    for args, code, option in commands(registry, gate_json, link):
        result = run_specreg(args)
        one_line(result, code, f"{option} {link}: a symlink to {victim}; refusing to write through it")
        assert link.is_symlink(), args
        if dangling:
            assert not victim.exists(), args
        else:
            assert victim.read_text() == "keep me\n", args


def test_reports_replace_a_regular_file_with_a_fresh_one(registry, tmp_path):
    """A second name of the same file (a hard link) keeps its text: the report is a new file."""
    report = tmp_path / "gate.md"
    report.write_text("old\n")
    other_name = tmp_path / "other-name"
    os.link(report, other_name)
    assert run_specreg(["gate", "p@1", "--env", "staging", "--markdown", report, "--db", registry]).returncode == 100
    assert report.read_text().startswith("## specreg gate p@1") and other_name.read_text() == "old\n"


def test_github_output_appends_to_the_runners_file_and_dotenv_is_written_fresh(gate_json, tmp_path):
    """$GITHUB_OUTPUT holds what earlier steps wrote: appended to, never replaced. A dotenv report
    is one job's whole file: one that already exists (a checkout's own gate.env) is refused,
    since its lines would count as the gate's."""
    output = tmp_path / "github_output"
    output.write_text("earlier=step\n")
    assert run_specreg(["ci-outputs", gate_json, "--style", "github", "--output", output]).returncode == 0
    assert output.read_text().startswith("earlier=step\nverdict=refused\n")
    dotenv = tmp_path / "gate.env"
    assert run_specreg(["ci-outputs", gate_json, "--style", "dotenv", "--output", dotenv]).returncode == 0
    assert dotenv.read_text().startswith("SPECREG_VERDICT=refused\n")
    dotenv.write_text("SPECREG_VERDICT=pass\n")
    result = run_specreg(["ci-outputs", gate_json, "--style", "dotenv", "--output", dotenv])
    one_line(result, 1, f"--output {dotenv}: exists; refusing to overwrite it")
    assert dotenv.read_text() == "SPECREG_VERDICT=pass\n"


@pytest.mark.parametrize("special", ["folder", "fifo"])
def test_an_output_path_that_is_a_folder_or_fifo_is_one_line(gate_json, tmp_path, special):
    path = tmp_path / "out"
    os.mkdir(path) if special == "folder" else os.mkfifo(path)
    for style in ("github", "dotenv"):
        result = run_specreg(["ci-outputs", gate_json, "--style", style, "--output", path])
        one_line(result, 1, f"--output {path}: a {'folder' if special == 'folder' else 'FIFO'}, not a regular file")


def test_a_private_key_is_written_0600_and_never_over_a_file(tmp_path):
    from specreg.core.files import write_fresh
    from specreg.errors import SpecregError

    key = write_fresh(tmp_path / "k", b"secret", "signing key", mode=0o600, overwrite=False)
    assert key.stat().st_mode & 0o777 == 0o600 and key.read_bytes() == b"secret"
    with pytest.raises(SpecregError, match=f"^signing key {key}: exists; refusing to overwrite it$"):
        write_fresh(key, b"other", "signing key", mode=0o600, overwrite=False)
    assert key.read_bytes() == b"secret" and sorted(p.name for p in tmp_path.iterdir()) == ["k"]


def test_keys_export_still_writes_the_keyring(registry, tmp_path):
    out = tmp_path / "keyring.json"
    assert run_specreg(["keys", "export", "--out", out, "--db", registry]).returncode == 0
    assert json.loads(out.read_text())["keyring_format"]

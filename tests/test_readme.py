"""The README's quickstart runs as written: its shell block, extracted from README.md and run
verbatim by bash on two tiny local models in a fresh home, reaches production, exports, verifies
and passes the gate. The README's and the docs' links resolve. So the README cannot drift from
the CLI again."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def quickstart_block(text: str) -> str:
    """The first ```sh block under the README's `## Quickstart` heading."""
    section = text.split("\n## Quickstart\n", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"^```sh\n(.*?)^```$", section, re.S | re.M)
    assert match, "no ```sh block in the quickstart"
    return match.group(1)


@pytest.fixture(scope="module")
def agreeing_pair(tmp_path_factory):
    """A target and a draft that agree, the draft cheaper (tinymodels.build_agreeing_pair), in a
    home folder of their own as ~/models/target and ~/models/draft."""
    from tinymodels import build_agreeing_pair

    home = tmp_path_factory.mktemp("home")
    build_agreeing_pair(home / "models", target_layers=6)
    return home


@pytest.mark.slow
def test_the_quickstart_runs_as_written(agreeing_pair, tmp_path):
    block = quickstart_block(README.read_text(encoding="utf-8"))
    home, work = agreeing_pair, tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "HOME": str(home), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    for name in ("SPECREG_HOME", "SPECREG_USER", "SPECREG_DB", "SPECREG_POLICY"):
        env.pop(name, None)  # as a first user has it: ~/.specreg, the built-in policy
    # SPECREG_MLFLOW=off stays (conftest): the mirror is tested against a real server in tests/mlflow
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=work, env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert "Traceback" not in result.stderr
    out = result.stdout
    assert "chat@1: validation run 1 passed on golden set default; state validated" in out
    assert "promoted chat@1 to production" in out
    assert "verified chat@1: signed lock, files match" in out
    assert "gate chat@1 -> production: PASS" in out
    suite = ET.parse(work / "gate.xml").getroot().find("testsuite")
    assert suite.get("failures") == "0" and suite.get("errors") == "0"
    assert (work / "validation.html").exists() and (work / "deploy" / "specreg.lock.json").exists()
    assert (home / ".specreg" / "registry.db").exists()  # the default home, as the README says


def test_the_readme_stays_short_and_keeps_its_set_up_commands():
    text = README.read_text(encoding="utf-8")
    assert text.count("\n") <= 350
    head = "\n".join(text.splitlines()[:40])
    assert "make demo" in head and "make test" in head
    makefile = (ROOT / "Makefile").read_text()
    assert "\ndemo:" in makefile and "\ntest:" in makefile


def test_the_demo_never_trains_the_real_head_unasked():
    """The real EAGLE-3 head's training (up to an hour of CPU) ran detached from `make demo` and
    took the cores from the `make test` after it (13:53 instead of about 7 minutes). The demo only
    asks the cache for it (`--cached`) and starts nothing in the background; `make real-head`
    trains it, as Make itself reads the target."""
    script = (ROOT / "scripts" / "demo.sh").read_text()
    head_runs = re.findall(r"^\s*(?:if\s+)?specreg demo-pair .*--real --method eagle3.*$", script, re.M)
    assert head_runs and all("--cached" in run for run in head_runs), head_runs
    assert "nohup" not in script and "setsid" not in script
    assert "make real-head" in script
    planned = subprocess.run(["make", "-n", "real-head"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                             env={**os.environ, "MAKEFLAGS": ""})
    assert planned.returncode == 0, planned.stderr
    assert re.search(r"specreg demo-pair \S*/real\"? --real --method eagle3$", planned.stdout, re.M), planned.stdout


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found, fenced = set(), False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            found.add(github_anchor(line.lstrip("#")))
    return found


@pytest.mark.parametrize("page", [README, *sorted((ROOT / "docs").glob("*.md"))], ids=lambda p: p.name)
def test_every_relative_link_resolves(page):
    text = re.sub(r"^```.*?^```$", "", page.read_text(encoding="utf-8"), flags=re.S | re.M)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        file_part, _, anchor = target.partition("#")
        linked = (page.parent / file_part).resolve() if file_part else page
        if not linked.exists():
            broken.append(target)
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(target)
    assert not broken, f"{page.name}: links that lead nowhere: {broken}"


def documented_command_lines(text: str) -> list[str]:
    """Every `specreg ...` command line of a page: in its shell blocks (continuations joined,
    comments, redirections and what follows `|`, `&&`, `;` taken off) and in its inline code."""
    found = []
    for block in re.findall(r"^```(?:sh|bash|console|shell)\n(.*?)^```", text, re.S | re.M):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            found += re.split(r"&&|\|\||;|\|", "" if line.lstrip().startswith("#") else line.split(" #")[0])
    for span in re.findall(r"`(specreg [^`\n]+)`", text):
        found += re.split(r"&&|\|\||;|\|", span)[:1]
    return [re.sub(r"\s\d?>>?&?\s*\S+", "", line).strip() for line in found if line.strip().startswith("specreg ")]


def click_problem(line: str) -> str | None:
    """Why click would refuse ``line``'s options and arguments (an unknown command or option, an
    option without its value, an extra argument), None when it parses. Placeholders stand for
    values: `[...]` marks optional parts, `...` a value or a repeat, and a required option or a
    placeholder of the wrong type (`VERSION` for a number) is not a problem of the page."""
    import shlex

    import click

    from specreg.cli import cli

    tokens = [token.strip("[]") for token in shlex.split(line)[1:]]
    tokens = ["X" if token in ("...", "…") or token.endswith("…") else token for token in tokens if token.strip("[]")]
    if tokens[:1] in (["--help"], ["-h"], ["--version"]):
        return None
    if tokens and tokens[-1].startswith("--") and len(tokens) <= 3:
        return None  # prose naming an option (`specreg verify --keyring`), not a command line
    command, rest, parent = cli, tokens, cli.make_context("specreg", [], resilient_parsing=True)
    while isinstance(command, click.Group):
        sub = command.get_command(parent, rest[0]) if rest else None
        if sub is None:
            return f"unknown command {rest[:1]}"
        command, rest = sub, rest[1:]
    saved = [(param, param.required) for param in command.params]
    for param, _ in saved:
        param.required = False
    try:
        command.make_context(command.name, list(rest), parent=parent)
    except click.BadParameter:
        return None  # a placeholder where a number or a choice goes
    except click.UsageError as exc:
        return exc.format_message()
    finally:
        for param, required in saved:
            param.required = required
    return None


@pytest.mark.parametrize("page", [README, *sorted((ROOT / "docs").glob("*.md"))], ids=lambda p: p.name)
def test_every_documented_command_line_parses(page):
    """Was: docs/deploy.md wrote `verify ... [--config vllm-serve.sh ...]` and `--config FILE…`,
    read as `--config A B`; the CLI takes `--config A --config B` (extra argument B)."""
    lines = documented_command_lines(page.read_text(encoding="utf-8"))
    problems = [(line, problem) for line in lines if (problem := click_problem(line))]
    assert not problems, problems


def test_the_command_line_check_catches_what_click_refuses():
    assert click_problem("specreg verify --lock l --config a.yaml b.yaml") == "Got unexpected extra argument (b.yaml)"
    assert "No such option" in click_problem("specreg export chat@1 --formt vllm")
    assert "requires an argument" in click_problem("specreg export chat@1 -o deploy/ --format")
    assert click_problem("specreg verify --lock l --config a.yaml --config b.yaml") is None
    assert click_problem("specreg policy approve VERSION --key k") is None


def test_the_commands_page_says_what_k8s_vllm_needs():
    """A first user ran `export --format k8s-vllm` from the format list beside the quickstart
    and met the model_volume requirement only in the error."""
    lines = documented_command_lines((ROOT / "docs" / "commands.md").read_text(encoding="utf-8"))
    assert any("--format k8s-vllm" in line and "--option model_volume=" in line for line in lines)

"""`specreg validate` at the command line: exit codes 0 / 100 / 1, the table, --json, and the
HTML / Markdown / JUnit outputs (self-contained: no network resource)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ElementTree

from clirun import run_specreg  # tests/ is on sys.path (tests/conftest.py)


def run_cli(*args) -> tuple[int, str, str]:
    """`specreg ARGS` in this process (tests/clirun.py) -> (exit code, stdout, stderr)."""
    result = run_specreg(args)
    return result.returncode, result.stdout, result.stderr


def test_exit_codes_table_and_reports(registry, models, golden_path, tmp_path):
    db = ["--db", registry.db_url]
    registry.register("cli", target=str(models["target"]), draft=str(models["self"]), num_speculative_tokens=3)
    report, markdown, junit = tmp_path / "r.html", tmp_path / "r.md", tmp_path / "r.xml"
    code, out, _ = run_cli("validate", "cli@1", "--golden", str(golden_path), "--device", "cpu",
                           "--checks", "integrity,equivalence,acceptance,performance", "--report", str(report),
                           "--markdown", str(markdown), "--junit", str(junit), *db)
    assert code == 0, out
    assert "CHECK" in out and "equivalence" in out and "cli@1: validation run 1 passed on golden set tiny; state validated" in out
    html = report.read_text()
    assert html.count("<svg") == 2 and "per-position acceptance" in html and "latency histogram" in html
    assert "<script" not in html and "src=" not in html and "href=" not in html and "https://" not in html
    assert "| equivalence | ✅ pass |" in markdown.read_text()
    suite = ElementTree.parse(junit).getroot().find("testsuite")
    assert suite.get("tests") == "4" and suite.get("failures") == "0"

    registry.register("cli", target=str(models["target"]), draft=str(models["draft"]), num_speculative_tokens=3)
    code, out, err = run_cli("validate", "cli@2", "--golden", str(golden_path), "--device", "cpu",
                             "--checks", "acceptance", "--json", "--junit", str(junit), *db)
    assert code == 100
    data = json.loads(out)
    assert data["status"] == "failed" and data["state"] == "failed" and data["checks"][0]["status"] == "fail"
    assert err.strip().splitlines()[-1] == "specreg: error: cli@2 failed validation run 2: acceptance failed"
    assert "Traceback" not in err
    assert ElementTree.parse(junit).getroot().find("testsuite").get("failures") == "1"

    code, _, err = run_cli("validate", "cli@2", "--golden", str(tmp_path / "missing.yaml"), *db)
    assert code == 1 and "missing.yaml" in err and err.strip().count("\n") == 0  # before any model loads
    code, _, err = run_cli("validate", "cli@2", "--checks", "nope", *db)
    assert code == 2 and "unknown check 'nope'" in err

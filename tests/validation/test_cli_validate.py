"""`specreg validate` at the command line: exit codes 0 / 100 / 1, the table, --json, and the
HTML / Markdown / JUnit outputs (self-contained: no network resource)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ElementTree

from clirun import one_line, run  # tests/ is on sys.path (tests/conftest.py)


def test_exit_codes_table_and_reports(registry, models, golden_path, tmp_path):
    db = ["--db", registry.db_url]
    registry.register("cli", target=str(models["target"]), draft=str(models["self"]), num_speculative_tokens=3)
    report, markdown, junit = tmp_path / "r.html", tmp_path / "r.md", tmp_path / "r.xml"
    result = run("validate", "cli@1", "--golden", str(golden_path), "--device", "cpu",
                 "--checks", "integrity,equivalence,acceptance,performance", "--report", str(report),
                 "--markdown", str(markdown), "--junit", str(junit), *db)
    out = result.stdout
    assert result.returncode == 0, out
    assert "CHECK" in out and "equivalence" in out and "cli@1: validation run 1 passed on golden set tiny; state validated" in out
    # in a log the first line comes as the run starts, before the imports, hashing and tokenizers
    assert result.stderr.splitlines()[0] == "validation run 1 of cli@1: golden set tiny, 3 prompt(s), on cpu"
    html = report.read_text()
    assert html.count("<svg") == 2 and "per-position acceptance" in html and "latency histogram" in html
    assert "<script" not in html and "src=" not in html and "href=" not in html and "https://" not in html
    assert "| equivalence | PASS |" in markdown.read_text()
    suite = ElementTree.parse(junit).getroot().find("testsuite")
    assert suite.get("tests") == "4" and suite.get("failures") == "0"

    registry.register("cli", target=str(models["target"]), draft=str(models["draft"]), num_speculative_tokens=3)
    result = run("validate", "cli@2", "--golden", str(golden_path), "--device", "cpu",
                 "--checks", "acceptance", "--json", "--junit", str(junit), *db)
    assert result.returncode == 100
    data, err = json.loads(result.stdout), result.stderr
    assert data["status"] == "failed" and data["state"] == "failed" and data["checks"][0]["status"] == "fail"
    assert err.strip().splitlines()[-1] == "specreg: error: cli@2 failed validation run 2: acceptance failed"
    assert ElementTree.parse(junit).getroot().find("testsuite").get("failures") == "1"

    one_line(run("validate", "cli@2", "--golden", str(tmp_path / "missing.yaml"), *db), 1,
             "missing.yaml")  # before any model loads
    one_line(run("validate", "cli@2", "--checks", "nope", *db), 2, "unknown check 'nope'")

"""The gate's machine outputs: JUnit XML (one testcase per condition, so CI systems list each
requirement) and a Markdown summary for ``$GITHUB_STEP_SUMMARY`` / merge-request notes.

Built with xml.etree so every reason is escaped correctly; no template can produce invalid XML.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from specreg.registry.governance.decisions import NOT_JUDGED, GateResult


def junit_xml(result: GateResult | None, error: str | None = None, subject: str = "") -> str:
    """JUnit XML for a gate result; with ``error`` (the gate could not be evaluated) one
    errored testcase, so a pipeline reading only the XML still fails closed."""
    suite_name = (f"specreg gate {result.pair}@{result.version} -> {result.environment}" if result is not None
                  else f"specreg gate {subject}".strip())
    suite = ET.Element("testsuite", name=suite_name)
    if result is not None:
        properties = ET.SubElement(suite, "properties")
        if result.audit_head:
            # the audit chain's head when judged: `specreg audit verify --expect-head` checks it later
            ET.SubElement(properties, "property", name="specreg.audit_head", value=result.audit_head)
        # the policy the verdict was judged under
        ET.SubElement(properties, "property", name="specreg.policy", value=result.policy_source)
        if result.policy_sha256:
            ET.SubElement(properties, "property", name="specreg.policy_sha256", value=result.policy_sha256)
    if error is not None or result is None:
        case = ET.SubElement(suite, "testcase", classname="specreg.gate", name="evaluate")
        ET.SubElement(case, "error", message=error or "gate not evaluated", type="error").text = error
        counts = {"tests": "1", "failures": "0", "errors": "1"}
    else:
        failures = skipped = 0
        for condition in result.conditions:
            case = ET.SubElement(suite, "testcase", classname=f"specreg.gate.{result.environment}", name=condition.name)
            if condition.passed:
                ET.SubElement(case, "system-out").text = condition.reason
            elif NOT_JUDGED in condition.details:  # the failed condition it waits for is the failure
                ET.SubElement(case, "skipped", message=condition.reason)
                skipped += 1
            else:
                failures += 1
                ET.SubElement(case, "failure", message=condition.reason, type="refused").text = condition.reason
        counts = {"tests": str(len(result.conditions)), "failures": str(failures), "errors": "0",
                  "skipped": str(skipped)}
    for key, value in counts.items():
        suite.set(key, value)
    suites = ET.Element("testsuites")
    suites.append(suite)
    ET.indent(suites)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


def markdown_summary(result: GateResult | None, error: str | None = None, subject: str = "") -> str:
    """A Markdown table of the conditions with the verdict on top."""
    if error is not None or result is None:
        # the subject is what the pipeline was given, not a checked name: one line in a code span,
        # so a newline and "## ... PASS" in it cannot forge a heading of the job summary
        heading = f"## specreg gate `{escape_cell(subject).replace('`', chr(39))}`: ERROR" if subject \
            else "## specreg gate: ERROR"
        return f"{heading}\n\n{escape_cell(error or 'gate not evaluated')}\n\nThe gate fails closed.\n"
    verdict = "PASS" if result.passed else "REFUSED"
    lines = [f"## specreg gate {result.pair}@{result.version} → {result.environment}: {verdict}", "",
             f"Policy: `{result.policy_source}`"
             + (f" (sha256 `{result.policy_sha256[:12]}`)" if result.policy_sha256 else "")
             + (f" · validation run {result.validation_run_id}" if result.validation_run_id is not None else "")
             + (f" · audit head `{result.audit_head}`" if result.audit_head else ""), "",
             "| | condition | reason |", "|---|---|---|"]
    for condition in result.conditions:
        # words, not emoji: the summary is also a version's description in MLflow's UI, where a
        # browser without an emoji font drew each emoji as an empty box
        mark = "PASS" if condition.passed else "NOT JUDGED" if NOT_JUDGED in condition.details else "FAIL"
        lines.append(f"| {mark} | `{condition.name}` | {escape_cell(condition.reason)} |")
    return "\n".join(lines) + "\n"


def escape_cell(text: str) -> str:
    """Keep a reason inside its table cell: no pipes, newlines or other control characters (a
    vertical tab, a Unicode line separator) break the row or start a line of their own."""
    one_line = "".join(" " if not character.isprintable() else character for character in text)
    return one_line.replace("\\", "\\\\").replace("|", "\\|")

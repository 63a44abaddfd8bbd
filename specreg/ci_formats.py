"""What a CI/CD pipeline reads from a gate: its verdict as step outputs (GitHub Actions'
``$GITHUB_OUTPUT``, GitLab's dotenv report) and its Markdown report cut to fit a job summary.

The gate itself (``Registry.gate``) writes JSON; this module only turns that JSON into the
formats the runners read, within their limits (docs/ci.md):
- GitHub ``$GITHUB_OUTPUT``: ``name=value`` lines, a multi-line value as ``name<<DELIMITER``,
  its lines, ``DELIMITER`` (a delimiter that occurs in no line of the value).
- GitHub ``$GITHUB_STEP_SUMMARY``: at most 1024 KiB a step, a larger one is dropped whole.
- GitLab ``artifacts:reports:dotenv``: ``NAME=value`` lines, names of ASCII letters, digits and
  ``_``, no quotes, comments, empty lines or multi-line values, under 5 KiB and 20 variables.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from typing import Any


STEP_SUMMARY_LIMIT = 1024 * 1024  # bytes GitHub keeps of one step's summary
DOTENV_LIMIT = 5 * 1024  # bytes of a GitLab dotenv report
SUMMARY_CUT_NOTE = ("\n\n**specreg: this report was cut to fit GitHub's 1 MiB step summary; the whole report "
                    "is in the gate's Markdown file.**\n")


def gate_outputs(gate: dict[str, Any], lock: bytes | None = None, lock_name: str = "") -> dict[str, str]:
    """The outputs of one gate run, from its ``--json`` document (a verdict or an error).

    ``lock``: the bytes of the pair lock (specreg.lock.json) the pipeline will deploy, read from
    ``lock_name``; its sha256 becomes ``lock_digest`` when it binds the version the gate judged
    (nothing is checked when the gate erred). A lock that binds another version, or is not a
    lock, makes the verdict ``refused`` with that reason last (fail closed: the outputs are
    still written, the caller exits 100). Out: name -> value, in this order: verdict, pair,
    version, environment, binding, lock_digest, audit_head, reasons (one line per failed
    condition; the error on an error). Every value but reasons is one line, and each reason is
    one line of reasons, whatever newlines the gate's text held."""
    verdict = one_line(str(gate.get("verdict") or "error"))
    reasons = gate.get("reasons") or ([gate["error"]] if gate.get("error") else [])
    outputs = {
        "verdict": verdict,
        "pair": one_line(str(gate.get("pair") or "")),
        "version": "" if gate.get("version") is None else one_line(str(gate["version"])),
        "environment": one_line(str(gate.get("environment") or "")),
        "binding": one_line(str(gate.get("binding_sha256") or "")),
        "lock_digest": "",
        "audit_head": one_line(str(gate.get("audit_head") or "")),
        "reasons": "\n".join(one_line(str(reason)) for reason in (reasons if isinstance(reasons, list) else [reasons])),
    }
    if lock is not None and outputs["binding"]:  # a gate that erred judged no binding to hold a lock to
        problem = lock_problem(lock, lock_name, outputs)
        if problem is None:
            outputs["lock_digest"] = hashlib.sha256(lock).hexdigest()
        else:
            outputs["verdict"] = "refused" if verdict == "pass" else verdict
            outputs["reasons"] = "\n".join(filter(None, [outputs["reasons"], problem]))
    return outputs


def lock_problem(lock: bytes, lock_name: str, outputs: dict[str, str]) -> str | None:
    """Why the pair lock ``lock`` does not go with the gated version, in one line; None when it
    binds it."""
    try:
        bound = json.loads(lock)["pair"]["binding_sha256"]
    except RecursionError:
        return f"pair lock {lock_name}: not a readable specreg.lock.json (nested too deeply)"
    except (ValueError, KeyError, TypeError) as exc:
        return one_line(f"pair lock {lock_name}: not a readable specreg.lock.json ({type(exc).__name__}: {exc})")
    if bound != outputs["binding"]:
        return one_line(f"pair lock {lock_name} binds {str(bound)[:12]}, not the gated "
                        f"{outputs['pair']}@{outputs['version']} ({outputs['binding'][:12]})")
    return None


def one_line(text: str) -> str:
    """``text`` with every newline, carriage return or other control character as one space: a
    runner reads a line of $GITHUB_OUTPUT or a dotenv report as one value."""
    return " ".join("".join(" " if not character.isprintable() else character for character in text).split())


def github_output(outputs: dict[str, str]) -> str:
    """``$GITHUB_OUTPUT`` text: ``name=value``, or the heredoc form for a multi-line value."""
    lines = []
    for name, value in outputs.items():
        if "\n" not in value and "\r" not in value:
            lines.append(f"{name}={value}")
            continue
        delimiter = f"ghadelimiter_{secrets.token_hex(16)}"
        while delimiter in value:  # a value cannot end the block early
            delimiter = f"ghadelimiter_{secrets.token_hex(16)}"
        lines += [f"{name}<<{delimiter}", *value.split("\n"), delimiter]
    return "\n".join(lines) + "\n"


def dotenv(outputs: dict[str, str], prefix: str = "SPECREG_") -> str:
    """A GitLab dotenv report: ``SPECREG_NAME=value`` lines, each value on one line, the reasons
    joined by ``; `` and cut so that the report stays under GitLab's 5 KiB."""
    lines = [f"{prefix}{name.upper()}={one_line(value) if name != 'reasons' else ''}"
             for name, value in outputs.items()]
    reasons = "; ".join(one_line(line) for line in outputs.get("reasons", "").split("\n") if line.strip())
    room = DOTENV_LIMIT - len("\n".join(lines).encode()) - 64
    if len(reasons.encode()) > room:
        reasons = reasons.encode()[:room].decode("utf-8", "ignore").rstrip() + " ... (cut; see gate.json)"
    return "\n".join(line + reasons if line == f"{prefix}REASONS=" else line for line in lines) + "\n"


def step_summary(markdown: str, limit: int = STEP_SUMMARY_LIMIT) -> str:
    """The Markdown report as a job summary keeps it: whole when it fits in ``limit`` bytes,
    else cut at a line end with a note saying so (GitHub drops a larger summary whole)."""
    data = markdown.encode("utf-8")
    if len(data) <= limit:
        return markdown
    room = limit - len(SUMMARY_CUT_NOTE.encode("utf-8"))
    cut = data[:room].decode("utf-8", "ignore")
    return cut[:cut.rfind("\n") + 1 if "\n" in cut else len(cut)] + SUMMARY_CUT_NOTE

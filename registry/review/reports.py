"""Validation reports: a self-contained HTML page (inline CSS and SVG, no network resource), a
Markdown summary (MLflow model-version description, $GITHUB_STEP_SUMMARY) and JUnit XML for CI,
all rendered from the Jinja2 templates in templates/reports/ over a persisted ValidationRun.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import specreg.templates
from specreg.core.baselines import in_engine_terms
from specreg.registry.store.entities import PairVersion, ValidationRun

# the specreg.templates package (templates/ at the top of the repository), not registry/templates
TEMPLATE_DIR = Path(specreg.templates.__file__).resolve().parent / "reports"
# words, not emoji: MLflow's UI (the run's summary.md, a version's description) in a browser
# without an emoji font, such as a headless Chromium, drew each emoji as an empty box
STATUS_MARK = {"pass": "PASS", "warn": "WARN", "fail": "FAIL", "skip": "SKIP", "error": "ERROR"}
CHART_WIDTH, CHART_HEIGHT, CHART_MARGIN = 560, 200, 36


def _environment(autoescape: bool):
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)), autoescape=autoescape,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["num"] = format_number
    env.filters["md"] = markdown_cell
    return env


def format_number(value: Any, digits: int = 3) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int) or float(value).is_integer() and abs(value) >= 1:
        return f"{int(value):,}"
    return f"{value:.{digits}g}" if abs(value) < 1e-3 else f"{value:.{digits}f}"


def markdown_cell(text: Any) -> str:
    """One table cell: no newline, no unescaped pipe."""
    return " ".join(str(text).split()).replace("|", "\\|")


def bar_chart(values: list[float], labels: list[str], max_value: float | None = None) -> dict[str, Any]:
    """Geometry of a vertical bar chart for the SVG templates -> {width, height, bars, ticks}."""
    plot_height = CHART_HEIGHT - 2 * CHART_MARGIN
    top = max_value if max_value else max(values, default=0) or 1.0
    slot = (CHART_WIDTH - 2 * CHART_MARGIN) / max(len(values), 1)
    bars = []
    for index, (value, label) in enumerate(zip(values, labels)):
        height = plot_height * (value / top if top else 0)
        bars.append({"x": CHART_MARGIN + index * slot + slot * 0.1, "width": slot * 0.8,
                     "y": CHART_MARGIN + plot_height - height, "height": height,
                     "label": label, "value": value, "label_x": CHART_MARGIN + index * slot + slot / 2})
    ticks = [{"y": CHART_MARGIN + plot_height * (1 - f), "label": format_number(top * f, 2)} for f in (0, 0.5, 1)]
    return {"width": CHART_WIDTH, "height": CHART_HEIGHT, "margin": CHART_MARGIN, "bars": bars, "ticks": ticks,
            "baseline_y": CHART_MARGIN + plot_height}


def report_context(run: ValidationRun, version: PairVersion | None = None) -> dict[str, Any]:
    """Everything the report templates show, from the persisted run (and the version)."""
    checks = {check.name: check for check in run.checks}
    acceptance = checks.get("acceptance")
    # an old run's tau was tokens per target forward: shown under that name, not as tau
    figures = in_engine_terms(((acceptance.evidence or {}).get("baselines") if acceptance else None)
                              or run.baselines) or {}
    overall = figures.get("overall") or {}
    per_position = [float(v) for v in overall.get("per_position_acceptance") or []]
    position_chart = bar_chart(per_position, [str(i + 1) for i in range(len(per_position))], 1.0) if per_position else None
    performance = checks.get("performance")
    histogram = ((performance.evidence or {}).get("latency_histogram") if performance else None) or {}
    latency_chart = None
    if histogram.get("counts"):
        edges = histogram["edges_ms"]
        latency_chart = bar_chart([float(c) for c in histogram["counts"]],
                                  [format_number(edges[i], 2) for i in range(len(histogram["counts"]))])
        latency_chart["axis"] = f"{format_number(edges[0], 3)} ms … {format_number(edges[-1], 3)} ms"
    return {
        "run": run,
        "version": version,
        "label": run.label,
        "checks": run.checks,
        "marks": STATUS_MARK,
        "verdict": (run.summary or {}).get("verdict") or run.status,
        "per_category": figures.get("per_category") or {},
        "overall": overall,
        "comparison": (acceptance.evidence or {}).get("comparison", []) if acceptance else [],
        "compared_with": (acceptance.evidence or {}).get("compared_with_version") if acceptance else None,
        "position_chart": position_chart,
        "latency_chart": latency_chart,
        "performance": performance.figures if performance else {},
        "environment": run.environment,
    }


def render_html(run: ValidationRun, version: PairVersion | None = None) -> str:
    return _environment(True).get_template("validation.html.j2").render(**report_context(run, version))


def render_markdown(run: ValidationRun, version: PairVersion | None = None) -> str:
    return _environment(False).get_template("validation.md.j2").render(**report_context(run, version))


def render_junit(run: ValidationRun) -> str:
    """JUnit XML: one test case per check; fail -> <failure>, error (could not run) -> <error>, skip -> <skipped>, warn -> passes
    with the summary in system-out."""
    return _environment(True).get_template("validation.junit.xml.j2").render(**report_context(run))


def check_writable(path: str | Path, option: str) -> Path:
    """Refuse, before any work is done, a report path that cannot be written: a directory, a
    file under a file, a folder without write permission. UsageError naming the option."""
    import os

    from specreg.errors import UsageError

    path = Path(path)
    if not str(path).strip() or "\0" in str(path):
        raise UsageError(f"{option} {str(path)!r}: not a file path")
    if path.is_symlink():  # dangling or not: the report would land where the link points
        raise UsageError(f"{option} {path}: a symlink to {os.readlink(path)}; refusing to write through it "
                         "(remove it first)")
    if path.is_dir():
        raise UsageError(f"{option} {path}: is a directory")
    if path.exists():
        if not os.access(path, os.W_OK):
            raise UsageError(f"{option} {path}: not writable")
        return path
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise UsageError(f"{option} {path}: {ancestor} is not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise UsageError(f"{option} {path}: cannot create files in {ancestor}")
    return path


def write_text(path: str | Path, text: str, option: str = "") -> Path:
    """Write a report as a fresh file (never through a symlink: specreg.core.files.write_fresh);
    refused or unwritable is one line (SpecregError) naming ``option`` and the path."""
    from specreg.core.files import write_fresh

    return write_fresh(path, text, option)

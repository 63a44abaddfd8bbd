"""The reviewer's view: the MLflow UI page of a pair's model version, rendered by a real headless
Chromium (Debian's `chromium`, installed by .ci/run), shows the gate summary and the alias."""

from __future__ import annotations

import html.parser
import os
import shutil
import subprocess

import pytest

from specreg.registry.review.mlflow_ui import model_version_url
from specreg.registry.review.mlflow_sync import MlflowSync

from helpers import in_ci  # tests/ is on sys.path (tests/conftest.py)


def _chromium() -> str | None:
    found = shutil.which("chromium") or ("/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None)
    if found is None:
        if in_ci():
            pytest.fail("chromium is not installed, and CI is set: .ci/run must install it")
        pytest.skip("chromium is not installed (apt-get install -y chromium); CI=true makes this a failure")
    return found


def _run_chromium(chromium: str, profile, url: str, *action: str) -> subprocess.CompletedProcess:
    argv = [
        chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--no-first-run", "--no-default-browser-check", f"--user-data-dir={profile}",
        "--window-size=1400,1000",
        # The UI is a React app: let it fetch and render before the DOM is read.
        "--virtual-time-budget=15000",
        *action, url,
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


class _VisibleText(html.parser.HTMLParser):
    """Text a reader sees: everything outside <script> and <style>."""

    def __init__(self):
        super().__init__()
        self.parts: list[str] = []
        self._hidden = 0

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "style"):
            self._hidden += 1

    def handle_endtag(self, tag):
        if tag in ("script", "style") and self._hidden:
            self._hidden -= 1

    def handle_data(self, data):
        if not self._hidden:
            self.parts.append(data)

    @classmethod
    def of(cls, markup: str) -> str:
        parser = cls()
        parser.feed(markup)
        return " ".join(" ".join(parser.parts).split())


@pytest.mark.slow
def test_model_version_page_shows_gate_summary_and_alias(
    mlflow_server, pair_name, make_pair_version, make_validation, tmp_path
):
    chromium = _chromium()
    sync = MlflowSync(mlflow_server.url)
    pair_version = make_pair_version(pair_name)
    summary = (
        f"## Gate summary {pair_name}@1\n\n"
        "| check | verdict | detail |\n|---|---|---|\n"
        "| acceptance | pass | acceptance rate 0.713 over 12 prompts |\n"
        "| equivalence | warn | 1 near-tie |\n"
    )
    run_id = sync.log_validation(pair_version, make_validation(), {"summary.md": summary})
    number = sync.ensure_model_version(pair_version, run_id, summary, {})
    sync.set_alias(pair_name, "production", pair_version)
    url = model_version_url(mlflow_server.url, sync.registered_model_name(pair_name), number)

    dumped = _run_chromium(chromium, tmp_path / "profile-dom", url, "--dump-dom")
    assert dumped.returncode == 0, dumped.stderr[-2000:]
    text = _VisibleText.of(dumped.stdout)
    assert f"Gate summary {pair_name}@1" in text, text[:3000]
    assert "acceptance rate 0.713 over 12 prompts" in text
    assert "1 near-tie" in text
    assert "production" in text  # the alias chip next to the version

    screenshot = tmp_path / "mlflow-model-version.png"
    shot = _run_chromium(chromium, tmp_path / "profile-shot", url, f"--screenshot={screenshot}")
    assert shot.returncode == 0, shot.stderr[-2000:]
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert screenshot.stat().st_size > 20_000  # a rendered page, not a blank one
    print(f"screenshot of {url}: {screenshot}")

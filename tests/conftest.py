"""Fixtures shared by every part of the suite: databases (SQLite and PostgreSQL), tiny models.

Every store test takes ``db_url`` and so runs on both databases. PostgreSQL: the server at
127.0.0.1:5432 (override with SPECREG_TEST_PG_URL); each test gets a fresh database that is
dropped afterwards. With CI=true an unreachable PostgreSQL fails the run instead of skipping.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from pathlib import Path

import pytest

# One torch (OpenMP) thread for the tiny test models, here and in every process the tests start:
# on this 2-core machine, shared with MLflow servers and other runs, two spinning OpenMP threads
# made tests/runtime 6x slower (82 s against 13 s for test_equivalence + test_runtime_config).
# Set before anything imports torch; an explicit OMP_NUM_THREADS of the caller wins.
os.environ.setdefault("OMP_NUM_THREADS", "1")

TESTS_DIR = Path(__file__).parent
sys.path.insert(0, str(TESTS_DIR))  # tinymodels and other shared test helpers

from mlflow_server import mlflow_server  # noqa: E402,F401  (session fixture: a real MLflow server)
from helpers import in_ci, isolate_environment  # noqa: E402
from pgroles import PG_ADMIN_URL, admin_connect, fresh_database  # noqa: E402


def pytest_configure(config):
    # pytest-xdist sorts the files of `--dist loadfile` by their number of tests, which leaves the
    # few-test files for last: the engine and real-model files, a minute or more each, the last of
    # which could run alone on one worker. The order of pytest_collection_modifyitems stands instead.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    """Files holding `slow` tests first, then the others by their number of tests (many first),
    each file's tests in their own order: with `make test`'s two workers (a file stays on one
    worker) the files of minutes start early and the quick ones fill in at the end."""
    files: dict[str, list] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::")[0], []).append(item)

    def weight(tests: list) -> tuple[bool, int]:
        return not any(test.get_closest_marker("slow") for test in tests), -len(tests)

    items[:] = [item for tests in sorted(files.values(), key=weight) for item in tests]


@pytest.fixture(autouse=True)
def isolated_home(tmp_path, monkeypatch):
    """No test touches ~/.specreg, a real MLflow store or the caller's environment."""
    isolate_environment(monkeypatch, tmp_path / "specreg-home")


@pytest.fixture(scope="session")
def terminal_line(pytestconfig):
    """A function that prints a line on the terminal of the run, past pytest's capture: for slow
    first-run preparation the person at `make test` should see while it runs (the engines'
    downloads). pytest-xdist's workers write their stderr to the same terminal."""
    capture = pytestconfig.pluginmanager.getplugin("capturemanager")  # None with -p no:capture

    def line(text: str) -> None:
        with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
            print(f"\n{text}", file=sys.stderr, flush=True)  # not after a row of dots

    return line


@pytest.fixture(scope="session")
def postgres_available() -> bool:
    try:
        with admin_connect() as connection:
            connection.execute("SELECT 1")
        return True
    except Exception as exc:  # noqa: BLE001 - any failure means: not reachable
        if in_ci():
            pytest.fail(f"PostgreSQL at {PG_ADMIN_URL} is unreachable in CI: {exc}")
        return False


@pytest.fixture
def postgres_url(postgres_available):
    """A fresh, empty PostgreSQL database for one test, owned by and connected as role
    ``tester`` (on PostgreSQL the actor is the database role: $SPECREG_USER is tester too);
    dropped afterwards. ``pgroles.as_user(url, NAME)`` connects as another role."""
    if not postgres_available:
        pytest.skip(f"PostgreSQL at {PG_ADMIN_URL} is not reachable (set CI=true to make this a failure)")
    with fresh_database() as url:
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path):
    """Every store test runs on SQLite and on PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'registry.db'}"
    return request.getfixturevalue("postgres_url")


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """A shared tokenizer and three tiny Llama models: target, draft, and a second draft."""
    from tinymodels import build_llama, build_tokenizer

    root = tmp_path_factory.mktemp("tiny-models")
    build_tokenizer(root / "tokenizer")
    paths = {
        "tokenizer": root / "tokenizer",
        "target": build_llama(root / "target", root / "tokenizer", seed=1, hidden_size=96),
        "draft": build_llama(root / "draft", root / "tokenizer", seed=2),
        "draft2": build_llama(root / "draft2", root / "tokenizer", seed=3),
    }
    return paths


@pytest.fixture(scope="session")
def models(tiny_models, tmp_path_factory) -> dict[str, Path]:
    """Pairs over the tiny models: target, draft (random), self (a copy of the target: accepts
    everything), padded (a draft whose embeddings have 20 padding rows beyond the tokenizer)."""
    from tinymodels import build_llama

    root = tmp_path_factory.mktemp("models")
    self_draft = Path(shutil.copytree(tiny_models["target"], root / "self"))
    padded = build_llama(root / "padded", tiny_models["tokenizer"], seed=5,
                         vocab_size=len(_tokenizer(tiny_models["tokenizer"])) + 20)
    return {"target": tiny_models["target"], "draft": tiny_models["draft"], "self": self_draft, "padded": padded}


def _tokenizer(path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


@pytest.fixture
def approval_key(tmp_path):
    """``approval_key(db_url, person)``: the path of ``person``'s private approval key, enrolled
    in that registry's keyring by admin (tests/approvers.py)."""
    from approvers import approval_key as make

    return lambda db_url, person: make(db_url, person, tmp_path)

"""Input bounds (P06, X02, X04, X05). Before each fix: `db grants` left a person's
role unable to record an engine baseline; a model folder registered through a symlink was
served by the link (re-pointed later to other weights); a golden file's 5000-digit
`max_new_tokens` was a traceback, `temperature: .nan` and `top_k: 10**30` were accepted and a
14 MB file took over 180 s to load; `/dev/zero` given to `keys enrol --public-key` or
`policy show --policy` was read without end. Each is one line on stderr, no traceback; the
store cases run on SQLite and PostgreSQL (conftest's db_url).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from clirun import one_line, run  # tests/ is on sys.path (tests/conftest.py)


@pytest.fixture
def registered(db_url, tiny_models) -> str:
    result = run("register", "p", "--target", tiny_models["target"], "--draft", tiny_models["draft"], "-k", "3",
                 "--db", db_url)
    assert result.returncode == 0, result.stderr
    return db_url


# --- P06: `db grants` covers every table specreg writes ------------------------------------------

def test_db_grants_name_every_table_of_the_schema():
    """Every table of the ORM is granted INSERT (a person's role writes rows to all of them); the
    schema's own bookkeeping (alembic_version) is the schema owner's."""
    from specreg.registry.store.grants import INSERT_TABLES
    from specreg.registry.store.orm import Base

    assert set(Base.metadata.tables) == set(INSERT_TABLES)
    printed = run("db", "grants", "alice").stdout
    assert "engine_baselines" in printed


def test_a_person_role_with_the_printed_grants_records_an_engine_baseline(postgres_url, tiny_models):
    """Was: InsufficientPrivilege for table engine_baselines (`validate --engine` as alice)."""
    from pgroles import as_user

    from specreg.api import Registry
    from specreg.registry.store.engine_baselines import EngineBaselineStore

    Registry(postgres_url).register("p", target=str(tiny_models["target"]), draft=str(tiny_models["draft"]),
                                    num_speculative_tokens=3)
    alice = Registry(as_user(postgres_url, "alice"), user="alice")
    recorded = EngineBaselineStore(alice.store).record(
        alice.get("p@1"), engine="vllm", engine_version="0.33.0", engine_build="vllm 0.33.0", source="http://x",
        passed=True, golden_set="smoke", golden_sha256="0" * 64, validation_run_id=None,
        baselines={"k": 3, "overall": {}}, report={}, actor="alice")
    assert [b.id for b in alice.engine_baselines("p@1")] == [recorded.id]


# --- X02: a model folder registered through a symlink is served by its resolved path ----------------

def test_a_symlinked_model_folder_is_exported_by_its_resolved_path(db_url, tiny_models, tmp_path):
    """The link is re-pointed to other weights after registration: the serve script still names
    the folder that was fingerprinted (and `specreg verify` against it passes)."""
    real = tmp_path / "target-v1"
    shutil.copytree(tiny_models["target"], real)
    link = tmp_path / "current"
    os.symlink(real, link)
    assert run("register", "p", "--target", link, "--draft", tiny_models["draft"], "-k", "3", "--db",
               db_url).returncode == 0
    link.unlink()
    os.symlink(tiny_models["draft2"], link)  # now other weights
    out = tmp_path / "out"
    exported = run("export", "p@1", "--format", "vllm", "--force", "-o", out, "--db", db_url)
    assert exported.returncode == 0, exported.stderr
    script = (out / "vllm-serve.sh").read_text()
    assert str(real) in script and str(link) not in script, script


# --- X04: golden-prompt numbers bounded and finite; the loader linear in its input ------------------

RECORD = "name: g\nversion: 1\nrecords:\n- id: a\n  category: c\n  prompt: hi\n"


@pytest.mark.parametrize("suffix,text,message", [
    (".yaml", RECORD + "  max_new_tokens: " + "9" * 5000 + "\n", "invalid YAML: Exceeds the limit (4300 digits)"),
    (".json", '{"name":"g","version":1,"records":[{"id":"a","category":"c","prompt":"hi","max_new_tokens":'
     + "9" * 5000 + "}]}", "invalid JSON: Exceeds the limit (4300 digits)"),
    (".yaml", RECORD + "  max_new_tokens: 65537\n", "field 'max_new_tokens': 65537 is greater than the maximum of 65536"),
    (".yaml", RECORD + "  max_new_tokens: 4\n  temperature: .nan\n", "field 'temperature': nan is not a finite number"),
    (".json", '{"name":"g","version":1,"records":[{"id":"a","category":"c","prompt":"hi","max_new_tokens":4,'
     '"temperature":NaN}]}', "field 'temperature': nan is not a finite number"),
    (".jsonl", '{"name":"g","version":1}\n{"id":"a","category":"c","prompt":"hi","max_new_tokens":4,"top_p":NaN}\n',
     "field 'top_p': nan is not a finite number"),
    (".yaml", RECORD + "  max_new_tokens: 4\n  temperature: .inf\n", "field 'temperature': inf is not a finite number"),
    (".yaml", RECORD + "  max_new_tokens: 4\n  temperature: 1.0\n  top_k: " + str(10**30) + "\n",
     "field 'top_k': 1000000000000000000000000000000 is greater than the maximum of 16777216"),
])
def test_golden_numbers_out_of_bounds_are_one_line(registered, tmp_path, suffix, text, message):
    golden = tmp_path / f"bad{suffix}"
    golden.write_text(text)
    result = run("validate", "p@1", "--golden", golden, "--checks", "integrity", "--db", registered)
    one_line(result, 1, str(golden), message)


def test_a_top_k_over_the_target_vocabulary_is_refused_before_validating(registered, tmp_path):
    golden = tmp_path / "topk.yaml"
    golden.write_text(RECORD + "  max_new_tokens: 4\n  temperature: 1.0\n  top_k: 100000\n")
    result = run("validate", "p@1", "--golden", golden, "--db", registered)
    one_line(result, 1, f"{golden}: records[0] (id 'a') field 'top_k': 100000 is over the vocabulary of the target "
                        f"(300 tokens)")
    runs = json.loads(run("show", "p@1", "--json", "--db", registered).stdout)
    assert runs["state"] == "registered"  # nothing was started


def sixteen_mib_of_tiny_records(path: Path, suffix: str) -> Path:
    limit = 16 * 2**20 - 4096
    if suffix == ".yaml":
        lines, size, i = ["name: big", "version: 1", "records:"], 40, 0
        while size < limit:
            lines.append(f"- {{id: r{i}, category: c, prompt: hi, max_new_tokens: 4}}")
            size, i = size + len(lines[-1]) + 1, i + 1
    else:
        lines, size, i = ['{"name": "big", "version": 1}'], 40, 0
        while size < limit:
            lines.append(json.dumps({"id": f"r{i}", "category": "c", "prompt": "hi", "max_new_tokens": 4}))
            size, i = size + len(lines[-1]) + 1, i + 1
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("suffix", [".yaml", ".jsonl"])
def test_a_16_mib_golden_file_is_refused_in_seconds(tmp_path, suffix):
    """Was: ~13 s a MiB of YAML (PyYAML's pure-Python parser, twice), a 14 MB file over 180 s.
    Now libyaml scans it and the mappings are counted before any is built: about 2 s here."""
    from specreg.errors import GoldenSetError
    from specreg.golden_prompts.loader import load_golden_file

    path = sixteen_mib_of_tiny_records(tmp_path / f"big{suffix}", suffix)
    started = time.perf_counter()
    with pytest.raises(GoldenSetError, match="more than 160000 mappings and lists|records, over the limit of 10000"):
        load_golden_file(path)
    assert time.perf_counter() - started < 30  # generous on a busy machine; before: minutes


def test_a_16_mib_golden_file_within_the_limits_loads_in_seconds(tmp_path):
    from specreg.golden_prompts.loader import MAX_RECORDS, load_golden_file

    prompt = "x" * (16 * 2**20 // MAX_RECORDS - 100)
    lines = ["name: big", "version: 1", "records:"]
    lines += [f"- {{id: r{i}, category: c, prompt: {prompt}, max_new_tokens: 4}}" for i in range(MAX_RECORDS)]
    path = tmp_path / "big.yaml"
    path.write_text("\n".join(lines) + "\n")
    assert path.stat().st_size > 15 * 2**20
    started = time.perf_counter()
    assert len(load_golden_file(path)) == MAX_RECORDS
    assert time.perf_counter() - started < 30


# --- X05: every file a path option reads is bounded ------------------------------------------------

@pytest.fixture
def fifo(tmp_path) -> Path:
    path = tmp_path / "fifo.yaml"
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("special", ["/dev/zero", "fifo", "folder"])
def test_every_path_option_refuses_a_device_fifo_or_folder_in_one_line(registered, tiny_models, tmp_path, special,
                                                                       fifo):
    """/dev/zero has size 0 for stat and never ends; opening a FIFO waits for a writer; a folder
    opens read-only, and was an IsADirectoryError traceback. Each path option of the CLI reads
    files through specreg.core.files.read_bounded."""
    folder = tmp_path / "folder.yaml"
    folder.mkdir()
    path = {"/dev/zero": "/dev/zero", "fifo": str(fifo), "folder": str(folder)}[special]
    db = ["--db", registered]
    keys = tmp_path / "keys"
    assert run("keys", "create", "--out", keys).returncode == 0
    out = tmp_path / "out"
    assert run("export", "p@1", "--format", "vllm", "--force", "-o", out, "--signing-key",
               keys / "specreg-signing.key", *db).returncode == 0
    lock = out / "specreg.lock.json"
    gate_json = tmp_path / "gate.json"
    gate_json.write_text(run("gate", "p@1", "--env", "staging", "--json", *db).stdout)
    verify = ["verify", "--lock", lock, "--target", tiny_models["target"], "--draft", tiny_models["draft"]]
    cases = [
        (["keys", "enrol", "bob", "--public-key", path, *db], "public key"),
        (["policy", "show", "--policy", path], "policy file"),
        (["gate", "p@1", "--env", "staging", "--policy", path, *db], "policy file"),
        (["export", "p@1", "--format", "vllm", "--force", "--template", path, *db], "template"),
        (["export", "p@1", "--format", "vllm", "--force", "-o", tmp_path / "o2", "--signing-key", path, *db],
         "signing key"),
        (["approve", "p@1", "--key", path, *db], "signing key"),
        (["verify", "--lock", path, "--target", tiny_models["target"], "--allow-unsigned"], "lock"),
        ([*verify, "--public-key", path], "public key"),
        ([*verify, "--public-key", keys / "specreg-signing.pub", "--config", path, "--allow-unapproved"], "--config"),
        (["policy", "propose", path, *db], "policy file"),
        (["ci-outputs", gate_json, "--style", "github", "--lock", path], "pair lock"),
        (["ci-outputs", path, "--style", "github"], "gate JSON"),
    ]
    if special != "/dev/zero":  # a golden set is named by its suffix: a FIFO can carry one
        cases.append((["validate", "p@1", "--golden", path, *db], "golden set"))
    for args, what in cases:
        started = time.perf_counter()
        result = run(*args)
        assert "Traceback" not in result.stderr, (args, result.stderr)
        assert result.returncode in (1, 2), (args, result.returncode, result.stderr)
        assert result.stderr.count("\n") == 1, (args, result.stderr)
        assert f"{what} {path}: " in result.stderr and "not a regular file" in result.stderr, (args, result.stderr)
        assert time.perf_counter() - started < 30, args


@pytest.mark.parametrize("special", ["/dev/zero", "folder"])
def test_the_keyring_file_refuses_a_device_or_folder(tmp_path, special):
    """`verify --keyring` reads it only for an approved lock; a folder was IsADirectoryError."""
    from specreg.errors import SpecregError
    from specreg.registry.governance.signatures import read_keyring_file

    path = "/dev/zero" if special == "/dev/zero" else str(tmp_path)
    kind = "a device" if special == "/dev/zero" else "a folder"
    with pytest.raises(SpecregError, match=f"^keyring {path}: {kind}, not a regular file$"):
        read_keyring_file(path)


def test_a_bounded_read_refuses_a_longer_file_without_reading_it_whole(tmp_path):
    from specreg.core.files import read_bounded
    from specreg.errors import SpecregError

    big = tmp_path / "big.pem"
    with open(big, "wb") as handle:
        handle.truncate(2**40)  # a sparse terabyte: read whole, this test would not end
    with pytest.raises(SpecregError, match=f"public key {big}: 1099511627776 bytes, over the limit of 65536"):
        read_bounded(big, 65536, "public key")

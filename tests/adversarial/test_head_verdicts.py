"""What register accepted and validate then refused: heads an engine cannot run are
refused at registration with the engine's reason; what an engine runs but specreg's runtime does
not is said at registration, and validate then records an error (exit 1), never a fail of the
pair. Real tiny Llama targets (tests/tinymodels.py), heads written by the runtime's own savers,
the CLI run as a user runs it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from clirun import one_line, run  # tests/ is on sys.path (tests/conftest.py)

LAYERS = 4  # vLLM's default aux ids (2, N // 2, N - 3) repeat a layer on 4, 5 and 6 layers


@pytest.fixture(scope="module")
def shallow(tiny_models, tmp_path_factory) -> dict[str, Path]:
    """A 4-layer Llama target over the tiny tokenizer; EAGLE-3 heads for it written by
    runtime.eagle3.save_eagle3_head: "named" reads layers [1, 2, 3], "default" names no ids (vLLM
    then reads the target's default [2, 2, 1]), "last" reads [1, 2, 4] (4 = the last layer's
    output). And the 2-layer tiny target with one MTP layer (runtime.mtp.save_target_with_mtp)."""
    from tinymodels import build_llama

    from specreg.runtime.methods.eagle3 import new_eagle3_head, save_eagle3_head
    from specreg.runtime.loading import load_model
    from specreg.runtime.methods.mtp import new_mtp_head, save_target_with_mtp

    root = tmp_path_factory.mktemp("shallow")
    target_dir = build_llama(root / "target", tiny_models["tokenizer"], seed=1, num_layers=LAYERS)
    target = load_model(target_dir)
    dirs = {"target": target_dir}
    for name, aux in (("named", (1, 2, 3)), ("default", (1, 2, 3)), ("last", (1, 2, 4))):
        dirs[name] = save_eagle3_head(new_eagle3_head(target, aux_layer_ids=aux, seed=3), root / name,
                                      str(target_dir), ["LlamaForCausalLM"])
    config = json.loads((dirs["default"] / "config.json").read_text())
    del config["eagle_aux_hidden_state_layer_ids"]  # fc stays sized for 3 states: vLLM's default count
    (dirs["default"] / "config.json").write_text(json.dumps(config))
    small = load_model(tiny_models["target"])
    dirs["mtp"] = save_target_with_mtp(new_mtp_head(small, seed=4), tiny_models["target"], root / "mtp")
    return dirs


def register(name, target, head, db_url, method="eagle3"):
    args = ["register", name, "--target", target, "--method", method, "-k", "2", "--db", db_url]
    return run(*args, *(["--draft", head] if head is not None else []))


def test_default_aux_ids_that_repeat_a_layer_are_refused_at_registration(shallow, db_url):
    result = register("dflt", shallow["target"], shallow["default"], db_url)
    one_line(result, 1, "aux layer ids: the head names none, and the target's default (2, N // 2, N - 3) = "
                        "[2, 2, 1] names layer 2 twice on this 4-layer target; vLLM 0.33 collects each layer once",
             "name eagle_aux_hidden_state_layer_ids in the head's config.json")
    assert "no pairs registered" in run("list", "--db", db_url).stdout
    # the same head naming its layers registers
    assert register("named", shallow["target"], shallow["named"], db_url).returncode == 0


def test_validate_on_such_a_head_gives_one_line_not_a_torch_error(shallow):
    """What validate runs on a pair registered before the refusal: the runtime's loader (was:
    "size mismatch for fc.weight: copying a param with shape torch.Size([64, 192]) ...") and the
    head check of the tokenizer step."""
    from specreg.errors import HeadMismatchError, RuntimeConfigError
    from specreg.runtime.methods import load_pair
    from specreg.validators.head_vocabulary import check_head_vocabulary

    with pytest.raises(RuntimeConfigError) as exc:
        load_pair(shallow["target"], shallow["default"], method="eagle3")
    message = str(exc.value)
    assert "\n" not in message and "names a layer twice on a 4-layer target" in message, message
    result = check_head_vocabulary("eagle3", str(shallow["default"]), str(shallow["target"]))
    assert result.status == "fail" and "names layer 2 twice" in result.summary and "\n" not in result.summary


def test_aux_id_n_is_said_at_registration_and_validate_records_an_error(shallow, db_url, tmp_path):
    result = register("last", shallow["target"], shallow["last"], db_url)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith(
        "specreg: warning: aux layer ids: [1, 2, 4] include 4, the output of the target's last layer: vLLM 0.33 "
        "reads it"), result.stderr
    shown = run("show", "last@1", "--db", db_url)
    assert "warning         aux layer ids: [1, 2, 4] include 4" in shown.stdout
    # the static checks run; the runtime checks could not: an error (exit 1), the pair not failed
    result = run("validate", "last@1", "--golden", "smoke", "--device", "cpu", "--json", "--db", db_url,
                 "--checks", "integrity,tokenizer,equivalence,acceptance", "--junit", tmp_path / "run.xml",
                 "--markdown", tmp_path / "run.md")
    one_line(result, 1, "last@1: validation run 1 could not judge the pair: equivalence: the check could not run: ",
             "aux layer id 4 (the last layer's output before the final norm) is read by vLLM, but this runtime "
             "reads ids 0..3 only")
    checks = {c["name"]: c["status"] for c in json.loads(result.stdout)["checks"]}
    assert checks == {"integrity": "pass", "tokenizer": "pass", "equivalence": "error", "acceptance": "skip"}
    assert json.loads(run("show", "last@1", "--json", "--db", db_url).stdout)["state"] == "registered"
    # the reports say so too: no green mark, a JUnit <error> (not a <failure>)
    assert (tmp_path / "run.md").read_text().startswith("### ERROR specreg validation last@1: error (run 1)")
    junit = (tmp_path / "run.xml").read_text()
    assert 'failures="0"' in junit and 'errors="2"' in junit and '<error message="the check could not run: ' in junit


def test_an_mtp_layer_without_eh_proj_is_refused_at_registration(shallow, db_url, tmp_path):
    from safetensors.torch import load_file, save_file

    layers = json.loads((shallow["mtp"] / "config.json").read_text())["num_hidden_layers"]
    assert register("mtp", shallow["mtp"], None, db_url, method="mtp").returncode == 0
    broken = Path(shutil.copytree(shallow["mtp"], tmp_path / "no-eh-proj"))
    weights = load_file(broken / "model.safetensors")
    del weights[f"model.layers.{layers}.eh_proj.weight"]
    save_file(weights, str(broken / "model.safetensors"), metadata={"format": "pt"})
    result = register("mtp-broken", broken, None, db_url, method="mtp")
    one_line(result, 1, f"MTP layer 0 has no model.layers.{layers}.eh_proj.weight: vLLM 0.33 builds it for deepseek "
                        "MTP layers and refuses a checkpoint without it (\"Following weights were not initialized "
                        "from checkpoint\", model_loader/default_loader.py:567)")
    assert [row["name"] for row in json.loads(run("list", "--json", "--db", db_url).stdout)] == ["mtp"]

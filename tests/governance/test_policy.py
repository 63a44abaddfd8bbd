"""The policy file: built-in default, TOML and YAML, strict keys, environment lookup."""

from __future__ import annotations

import pytest

from specreg.errors import NotFoundError, UsageError
from specreg.registry.governance.policy import load_policy

TOML = """\
golden_set = "smoke"
acceptance_tolerance = 0.05

[environments.staging]

[environments.production]
approval_required = true
approvers = ["carol", "dave"]
max_validation_age_days = 7
required_checks = ["equivalence"]
"""
YAML = """\
golden_set: smoke
acceptance_tolerance: 0.05
environments:
  staging: {}
  production:
    approval_required: true
    approvers: [carol, dave]
    max_validation_age_days: 7
    required_checks: [equivalence]
"""


def test_built_in_default_requires_approval_for_production_only(monkeypatch):
    policy = load_policy()
    assert policy.source == "built-in default"
    assert sorted(policy.environments) == ["production", "staging"]
    production, staging = policy.environment("production"), policy.environment("staging")
    assert production.approval_required and production.approvers == ()
    assert not staging.approval_required
    assert production.golden_set == "default" and "equivalence" in production.required_checks
    assert production.acceptance_tolerance == 0.10 and production.max_validation_age_days == 30


def test_toml_and_yaml_mean_the_same(tmp_path):
    (tmp_path / "p.toml").write_text(TOML)
    (tmp_path / "p.yaml").write_text(YAML)
    from_toml, from_yaml = load_policy(tmp_path / "p.toml"), load_policy(tmp_path / "p.yaml")
    assert from_toml.to_dict()["environments"] == from_yaml.to_dict()["environments"]
    production = from_toml.environment("production")
    assert production.approvers == ("carol", "dave") and production.required_checks == ("equivalence",)
    assert from_toml.environment("staging").acceptance_tolerance == 0.05  # top level is the default
    assert from_toml.environment("staging").max_validation_age_days is None
    assert from_toml.sha256 == from_yaml.sha256  # what a policy says, whatever it is written in


@pytest.mark.parametrize("text, message", [
    ("[environments.prod]\naproval_required = true\n", "unknown key 'environments.prod.aproval_required'"),
    ("[environments.prod]\napproval_required = 'yes'\n", "environments.prod.approval_required = 'yes' has the wrong type"),
    ("acceptance_tolerance = 1.5\n[environments.prod]\n", "acceptance_tolerance = 1.5 must be in [0, 1)"),
    ("acceptance_tolerance = true\n[environments.prod]\n", "acceptance_tolerance = True has the wrong type"),
    ("golden_set = 'x'\n", "needs at least one [environments.NAME] table"),
    ("[environments.Prod]\n", "invalid environment name 'Prod'"),
    ("[environments\n", "invalid TOML"),
])
def test_malformed_policies_are_one_line_usage_errors(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(UsageError) as error:
        load_policy(path)
    assert message in str(error.value) and str(path) in str(error.value) and "\n" not in str(error.value)


def test_missing_file_and_unknown_environment(tmp_path):
    with pytest.raises(UsageError, match="policy file .*missing.toml not found"):
        load_policy(tmp_path / "missing.toml")
    with pytest.raises(NotFoundError, match="unknown environment 'qa': policy built-in default defines production, staging"):
        load_policy().environment("qa")


def test_required_checks_by_method_parse_and_errors(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text('required_checks = ["integrity", "chat_template"]\n'
                    '[required_checks_by_method]\neagle3 = ["integrity"]\n'
                    '[environments.staging]\n'
                    '[environments.production]\nrequired_checks_by_method = {ngram = ["equivalence"]}\n')
    policy = load_policy(path)
    staging, production = policy.environment("staging"), policy.environment("production")
    assert staging.checks_for("eagle3") == ("integrity",)
    assert staging.checks_for("draft_model") == ("integrity", "chat_template")
    # an environment's table replaces the top-level one, as every key does
    assert production.checks_for("eagle3") == ("integrity", "chat_template")
    assert production.checks_for("ngram") == ("equivalence",)
    assert load_policy().environment("production").checks_for("medusa") == (
        "integrity", "tokenizer", "equivalence", "acceptance")
    path.write_text('[required_checks_by_method]\neagel3 = ["integrity"]\n[environments.prod]\n')
    with pytest.raises(UsageError, match=r"required_checks_by_method.eagel3: unknown method \(known: draft_model, "):
        load_policy(path)
    path.write_text('[required_checks_by_method]\neagle3 = "integrity"\n[environments.prod]\n')
    with pytest.raises(UsageError, match="required_checks_by_method.eagle3 must be a list of non-empty strings"):
        load_policy(path)

"""An engine validation's request (EngineValidationRequest): made once at the CLI's edge from
options named as its fields, with its defaults, checked when made, recorded as the baseline's
"options"."""

from __future__ import annotations

from dataclasses import fields

import pytest

from specreg.engine_validation.request import EngineValidationRequest
from specreg.errors import UsageError


def test_both_spellings_take_every_field_as_an_option_with_the_requests_default():
    """A new engine option is its field and its CLI option: `validate-engine` and `validate` each
    take every field, and their defaults make the request's own."""
    from specreg.cli import cli
    from specreg.cli.validate_engine import ENGINE_CHOICES, engine_request
    from specreg.registry.deploy.engine_client import ENGINES

    assert ENGINE_CHOICES == ENGINES  # the CLI's choice list is the one the request checks against
    names = [field.name for field in fields(EngineValidationRequest)]
    for command, args in (("validate-engine", ["x@1", "--engine", "llamacpp"]), ("validate", ["x@1"])):
        parsed = cli.commands[command].make_context(command, args).params
        assert set(names) <= set(parsed), command
        values = {name: parsed[name] for name in names}
        assert engine_request(**{**values, "engine": "llamacpp"}) == EngineValidationRequest(engine="llamacpp")


def test_the_request_records_its_options_with_concurrency_one_always():
    request = EngineValidationRequest(engine="vllm", engine_url="http://127.0.0.1:8000/", tiers=(4, 2, 4))
    assert request.to_dict() == {
        "engine": "vllm", "engine_url": "http://127.0.0.1:8000/", "reference_url": None, "model_name": None,
        "tiers": [1, 2, 4], "parity_tolerance": 0.03, "near_tie_tolerance": None, "dtype": "float32",
        "threads": None, "deadline_s": 600.0}
    assert not request.starts_server and EngineValidationRequest(engine="vllm").starts_server


@pytest.mark.parametrize("options, message", [
    ({"engine": "tgi"}, "invalid --engine 'tgi': use one of llamacpp, vllm, sglang"),
    ({"engine": "llamacpp", "tiers": (65,)}, "invalid --concurrency 65: tiers from 1 to 64"),
    ({"engine": "llamacpp", "threads": 257}, "invalid --engine-threads 257: 1 to 256"),
    ({"engine": "llamacpp", "parity_tolerance": float("nan")}, "invalid parity tolerance nan: use a fraction in (0, 1)"),
    ({"engine": "llamacpp", "near_tie_tolerance": float("inf")},
     "invalid near-tie tolerance inf: use a finite number >= 0"),
    ({"engine": "llamacpp", "deadline_s": 0.0},
     "invalid --engine-deadline 0.0: seconds, more than 0 and at most 86400"),
    ({"engine": "llamacpp", "dtype": "float16"},
     "invalid --dtype float16 for an engine validation: float32 or bfloat16 (comparable numerics)"),
    ({"engine": "sglang", "reference_url": "http://127.0.0.1:9"},
     "--engine sglang runs against a server you started: pass --engine-url URL"),
])
def test_a_request_that_cannot_run_is_refused_in_one_line_naming_the_option(options, message):
    with pytest.raises(UsageError) as caught:
        EngineValidationRequest(**options)
    assert str(caught.value) == message

import json

import pytest

from specreg.core.types import CheckResult, combine_statuses, summarize_findings


def test_check_result_round_trips_through_json():
    result = CheckResult("memory", "warn", "close to the limit",
                         {"models": {"draft": {"bytes": 10}}, "notes": ["a"]},
                         {"total_bytes": 123, "budget_utilization": 0.91})
    again = CheckResult.from_dict(json.loads(json.dumps(result.to_dict())))
    assert again == result
    assert not again.failed and CheckResult("x", "fail", "no").failed


@pytest.mark.parametrize("statuses, expected", [
    ([], "skip"),
    (["skip", "skip"], "skip"),
    (["skip", "pass"], "pass"),
    (["pass", "warn", "skip"], "warn"),
    (["warn", "fail", "pass"], "fail"),
])
def test_worst_status_wins(statuses, expected):
    assert combine_statuses(statuses) == expected


@pytest.mark.parametrize("kwargs", [
    {"status": "ok"},
    {"summary": "two\nlines"},
    {"figures": {"count": "3"}},
    {"figures": {"rate": float("nan")}},
])
def test_malformed_results_are_programming_errors(kwargs):
    fields = {"name": "x", "status": "pass", "summary": "fine", **kwargs}
    with pytest.raises(ValueError):
        CheckResult(**fields)
    with pytest.raises(ValueError):
        combine_statuses(["pass", "bogus"])


def test_summary_is_the_first_worst_finding_with_a_count():
    findings = [{"status": "warn", "message": "w"}, {"status": "fail", "message": "f1"},
                {"status": "fail", "message": "f2"}]
    assert summarize_findings(findings, "all good") == ("fail", "f1 (and 2 more findings)")
    assert summarize_findings([], "all good") == ("pass", "all good")


def test_statuses_are_their_words_wherever_they_go():
    """Every status vocabulary is an enum whose members print, format, JSON- and YAML-encode as
    the plain word that was stored, hashed and tagged before they were enums."""
    import yaml

    from specreg.core.statuses import CheckStatus, EngineBaselineStatus, GateVerdict, RunStatus

    words = {CheckStatus: ["pass", "warn", "fail", "skip", "error"],
             RunStatus: ["running", "passed", "failed", "aborted", "abandoned", "error"],
             EngineBaselineStatus: ["passed", "failed", "unaccepted"], GateVerdict: ["pass", "refused", "error"]}
    for kind, expected in words.items():
        assert [member.value for member in kind] == expected
        for member in kind:
            assert (str(member), f"{member}", "%s" % member, json.dumps(member)) == (
                member.value, member.value, member.value, f'"{member.value}"')
            assert member == member.value and kind(member.value) is member
    result = CheckResult("memory", "warn", "close")
    assert result.status is CheckStatus.WARN
    assert yaml.safe_load(yaml.safe_dump(result.to_dict()))["status"] == "warn"
    assert json.dumps(result.to_dict())[:40] == '{"name": "memory", "status": "warn", "su'

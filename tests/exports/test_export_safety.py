"""Approval gate, output paths that cannot escape, and user templates in the sandbox."""

from __future__ import annotations

import os

import pytest
import yaml
from exportcase import make_pair

from specreg.errors import PolicyViolation, SpecregError
from specreg.registry.store.entities import PairState, SpecMethod
from specreg.registry.deploy.exports import render_export
from specreg.registry.deploy.export_files import write_export


def test_unapproved_refused_without_force(draft_pair, baselines):
    with pytest.raises(PolicyViolation, match=r"chat-pair@3 is not validated and approved.*--force"):
        render_export(draft_pair, baselines, "vllm", approved=False)


@pytest.mark.parametrize("state", [PairState.REGISTERED, PairState.FAILED, PairState.RETIRED])
def test_state_not_validated_refused(state, baselines):
    with pytest.raises(PolicyViolation, match=f"state {state.value}"):
        render_export(make_pair(state=state), baselines, "vllm", approved=True)


def test_missing_baselines_refused(draft_pair):
    with pytest.raises(PolicyViolation, match="no recorded baselines"):
        render_export(draft_pair, None, "vllm", approved=True)


def test_force_marks_every_output_unapproved(draft_pair, baselines):
    for fmt in ("vllm", "sglang", "trtllm", "k8s-vllm", "prometheus-rules"):
        options = {"model_volume": "pvc:m"} if fmt == "k8s-vllm" else None
        for name, text in render_export(draft_pair, baselines, fmt, approved=False, force=True, options=options):
            if not name.endswith(".json"):
                assert "UNAPPROVED" in text, f"{fmt}/{name} not marked"
    k8s = dict(render_export(draft_pair, baselines, "k8s-vllm", approved=False, force=True,
                             options={"model_volume": "pvc:m"}))["k8s-vllm.yaml"]
    _, deployment, service = yaml.safe_load_all(k8s)
    assert deployment["metadata"]["annotations"]["specreg.io/approval"] == "UNAPPROVED"
    assert service["metadata"]["annotations"]["specreg.io/approval"] == "UNAPPROVED"


def test_force_without_baselines_renders_but_rules_need_a_baseline(draft_pair):
    files = dict(render_export(draft_pair, None, "vllm", approved=False, force=True))
    assert "baselines: none recorded" in files["vllm-serve.sh"]
    with pytest.raises(SpecregError, match="no recorded overall baseline"):
        render_export(draft_pair, None, "prometheus-rules", approved=False, force=True)


def test_write_export_refuses_escapes_and_writes_nothing(tmp_path):
    out = tmp_path / "out"
    for name in ("../evil.sh", "/tmp/evil.sh", "a/../../evil.sh", "", "."):
        with pytest.raises(SpecregError, match="escapes|relative path"):
            write_export([("fine.txt", "x"), (name, "x")], out)
        assert not (out / "fine.txt").exists() and not (tmp_path / "evil.sh").exists()


def test_write_export_refuses_symlink_escape(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, out / "link")
    with pytest.raises(SpecregError, match="escapes"):
        write_export([("link/evil.sh", "x")], out)
    assert not (outside / "evil.sh").exists()


def test_write_export_overwrite(tmp_path, draft_pair, baselines):
    files = render_export(draft_pair, baselines, "vllm", approved=True)
    written = write_export(files, tmp_path / "out")
    assert sorted(path.name for path in written) == ["vllm-serve.sh", "vllm-speculative-config.json"]
    assert written[0].read_text() == files[0][1]
    with pytest.raises(SpecregError, match="refusing to overwrite"):
        write_export(files, tmp_path / "out")
    assert write_export(files, tmp_path / "out", overwrite=True) == written


def test_user_template_renders_context(tmp_path, draft_pair, baselines):
    template = tmp_path / "launch.txt.j2"
    template.write_text("{{ pair.label }} k={{ config.num_speculative_tokens }} "
                        "alpha={{ baselines.overall.acceptance_rate }} {{ target.source | shquote }}\n")
    [(name, text)] = render_export(draft_pair, baselines, "vllm", approved=True, template_path=template)
    assert name == "launch.txt"
    assert text.startswith("chat-pair@3 k=4 alpha=0.71 '/models/Target Model'")


def test_user_html_template_is_autoescaped(tmp_path, baselines):
    pair = make_pair(SpecMethod.NGRAM, name="<script>alert(1)</script>")
    template = tmp_path / "card.html.j2"
    template.write_text("<h1>{{ pair.name }}</h1>")
    [(name, text)] = render_export(pair, baselines, "vllm", approved=True, template_path=template)
    assert name == "card.html"
    assert text == "<h1>&lt;script&gt;alert(1)&lt;/script&gt;</h1>"


@pytest.mark.parametrize("body", [
    "{{ ''.__class__.__mro__ }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ pair.__class__ }}",
    "{{ lipsum.__globals__ }}",
    "{% for key in config.__init__.__globals__ %}{{ key }}{% endfor %}",
])
def test_user_template_cannot_reach_python_internals(tmp_path, draft_pair, baselines, body):
    template = tmp_path / "evil.j2"
    template.write_text(body)
    with pytest.raises(SpecregError, match="evil.j2: refused by the sandbox"):
        render_export(draft_pair, baselines, "vllm", approved=True, template_path=template)


def test_user_template_errors_are_one_line(tmp_path, draft_pair, baselines):
    template = tmp_path / "broken.j2"
    template.write_text("line one\n{% if %}\n")
    with pytest.raises(SpecregError, match=r"broken.j2:2: syntax error") as info:
        render_export(draft_pair, baselines, "vllm", approved=True, template_path=template)
    assert "\n" not in str(info.value)
    template.write_text("{{ no_such_name.field }}")
    with pytest.raises(SpecregError, match="no_such_name"):
        render_export(draft_pair, baselines, "vllm", approved=True, template_path=template)
    with pytest.raises(SpecregError, match="no such file"):
        render_export(draft_pair, baselines, "vllm", approved=True, template_path=tmp_path / "missing.j2")


def test_user_template_still_obeys_format_refusals(tmp_path, draft_pair, baselines):
    template = tmp_path / "t.j2"
    template.write_text("{{ pair.label }}")
    with pytest.raises(SpecregError, match="no separate-draft mode"):
        render_export(draft_pair, baselines, "tgi", approved=True, template_path=template)
    with pytest.raises(PolicyViolation):
        render_export(draft_pair, baselines, "vllm", approved=False, template_path=template)

"""A loaded pair's linear layers run oneDNN's products on a CPU in float32 where MKL's are slow
(runtime/cpu_linear.py)."""

from __future__ import annotations

import platform

import pytest


def broken_linear(*args, **kwargs):
    raise AssertionError("nn.Linear's own forward (MKL) ran")


def test_a_loaded_pair_runs_every_linear_layer_on_onednn(tiny_dir, monkeypatch):
    import torch

    from specreg.runtime.cpu_linear import onednn_linear_class
    from specreg.runtime.methods import load_pair

    kind = onednn_linear_class()
    if platform.machine() in ("x86_64", "AMD64"):
        assert kind is not None, "torch's x86 builds ship oneDNN"
    if kind is None:
        pytest.skip("this torch build has no oneDNN linear")
    # a CPU where oneDNN would be taken, so that the size rule alone keeps the tiny models on MKL
    monkeypatch.setattr("specreg.runtime.cpu_linear.mkl_is_native", lambda: False)
    pair = load_pair(tiny_dir / "target", tiny_dir / "draft_random")
    linears = [module for model in (pair.target, pair.draft) for module in model.modules()
               if isinstance(module, torch.nn.Linear)]
    assert len(linears) == 3 * 7 + 1 + 7 + 1
    assert all(type(module) is torch.nn.Linear for module in linears)  # tiny models: MKL's products
    monkeypatch.setattr("specreg.runtime.cpu_linear.STREAMED_BYTES", 0)  # as for a model streamed from memory
    monkeypatch.setattr("specreg.runtime.cpu_linear.mkl_is_native", lambda: True)  # an Intel CPU: MKL's
    pair = load_pair(tiny_dir / "target", tiny_dir / "draft_random")
    assert all(type(module) is torch.nn.Linear for model in (pair.target, pair.draft) for module in model.modules()
               if isinstance(module, torch.nn.Linear))
    monkeypatch.setattr("specreg.runtime.cpu_linear.mkl_is_native", lambda: False)  # any other CPU
    pair = load_pair(tiny_dir / "target", tiny_dir / "draft_random")
    linears = [module for model in (pair.target, pair.draft) for module in model.modules()
               if isinstance(module, torch.nn.Linear)]
    assert all(type(module) is kind for module in linears)

    layer = pair.target.model.layers[0].mlp.down_proj
    rows = torch.randn(2, 5, layer.in_features)  # [batch, positions, in]
    expected = torch.nn.functional.linear(rows, layer.weight)
    monkeypatch.setattr(torch.nn.functional, "linear", broken_linear)
    with torch.inference_mode():
        out = layer(rows)  # runs without F.linear: oneDNN's product
        assert out.shape == expected.shape and torch.allclose(out, expected, atol=1e-5)
        assert layer(rows[:, -1:]).shape == (2, 1, layer.out_features)  # a strided slice, as the last position
    # autograd (the builders train heads) keeps nn.Linear's forward
    with pytest.raises(AssertionError, match="MKL"):
        layer(rows)


@pytest.mark.parametrize("vendor, native", [("GenuineIntel", True), ("AuthenticAMD", False), (None, False)])
def test_mkl_counts_as_native_on_an_intel_cpu_alone(tmp_path, vendor, native):
    from specreg.runtime.cpu_linear import mkl_is_native

    cpuinfo = tmp_path / "cpuinfo"
    lines = ["processor\t: 0", f"vendor_id\t: {vendor}" if vendor else "model name\t: unknown", "cpu family\t: 6"]
    cpuinfo.write_text("\n".join(lines * 2) + "\n")
    assert mkl_is_native(str(cpuinfo)) is native
    assert mkl_is_native(str(tmp_path / "absent")) is False


def test_only_plain_float32_cpu_layers_are_switched_and_nothing_is_copied(monkeypatch):
    import torch

    from specreg.runtime.cpu_linear import onednn_linear_class, use_onednn_linears

    kind = onednn_linear_class()
    if kind is None:
        pytest.skip("this torch build has no oneDNN linear")

    class OwnLinear(torch.nn.Linear):
        pass

    model = torch.nn.Sequential(torch.nn.Linear(4, 3), OwnLinear(3, 3), torch.nn.Linear(3, 2).double())
    weight = model[0].weight.data_ptr()
    monkeypatch.setattr("specreg.runtime.cpu_linear.mkl_is_native", lambda: False)  # the size rule decides
    assert use_onednn_linears(model) == 0  # 48 bytes of float32 weights: left to MKL
    assert use_onednn_linears(model, None, "not a module", min_bytes=48) == 1
    assert [type(layer) for layer in model] == [kind, OwnLinear, torch.nn.Linear]
    assert model[0].weight.data_ptr() == weight
    assert use_onednn_linears(model, min_bytes=0) == 0  # already switched

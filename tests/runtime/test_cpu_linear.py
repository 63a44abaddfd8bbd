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
    assert all(module.packs is kind.can_pack for module in linears)  # a few KB: they fit in any machine's memory

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


def packing_kind():
    from specreg.runtime.cpu_linear import onednn_linear_class

    kind = onednn_linear_class()
    if platform.machine() in ("x86_64", "AMD64"):
        assert kind is not None and kind.can_pack, "torch's x86 builds ship oneDNN with its weight packing"
    if kind is None or not kind.can_pack:
        pytest.skip("this torch build has no oneDNN weight packing")
    return kind


def test_a_packed_weight_is_made_once_and_again_when_the_weight_changes(monkeypatch):
    import torch

    from specreg.runtime.cpu_linear import use_onednn_linears

    packing_kind()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 48), torch.nn.Linear(48, 16, bias=False))
    assert use_onednn_linears(model, min_bytes=0, free_bytes=1 << 30) == 2
    assert [layer.packs for layer in model] == [True, True]
    rows = torch.randn(2, 7, 64)  # [batch, positions, in]

    def expected():
        first = torch.nn.functional.linear(rows, model[0].weight, model[0].bias)
        return torch.nn.functional.linear(first, model[1].weight)

    wanted = expected()
    monkeypatch.setattr(torch.nn.functional, "linear", broken_linear)
    with torch.inference_mode():
        assert torch.allclose(model(rows), wanted, atol=1e-5)
        packed = model[0]._packed[1]
        assert packed.layout == torch._mkldnn  # oneDNN's own layout, not the weight as it is
        assert torch.allclose(model(rows[:, -1:]), wanted[:, -1:], atol=1e-5)  # one position of each row
        assert model[0]._packed[1] is packed  # made once
    monkeypatch.undo()

    with torch.no_grad():
        model[0].weight.mul_(-2.0)  # written in place: the copy is stale
    model[1].weight = torch.nn.Parameter(torch.randn(16, 48))  # replaced
    wanted = expected()
    with torch.inference_mode():
        assert torch.allclose(model(rows), wanted, atol=1e-5)
    assert model[0]._packed[1] is not packed


def test_packed_copies_take_at_most_their_share_of_the_available_memory(monkeypatch):
    import torch

    from specreg.runtime.cpu_linear import PACKED_SHARE, use_onednn_linears

    kind = packing_kind()

    def models():
        return [torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Linear(32, 32)) for _ in range(2)]

    copies = (64 * 32 + 32 * 32) * 4  # bytes of each model's float32 weights
    first, second = models()
    # room for one model's copies, not two: the first packs, the second runs on its weights as they are
    assert use_onednn_linears(first, second, min_bytes=0, free_bytes=int(1.5 * copies / PACKED_SHARE)) == 4
    assert [layer.packs for layer in first] == [True, True] and [layer.packs for layer in second] == [False, False]
    rows = torch.randn(3, 64)
    with torch.inference_mode():
        out = second(rows)
    assert "_packed" not in vars(second[0]) and torch.allclose(
        out, torch.nn.functional.linear(torch.nn.functional.linear(rows, second[0].weight, second[0].bias),
                                        second[1].weight, second[1].bias), atol=1e-5)
    both = models()
    assert use_onednn_linears(*both, min_bytes=0, free_bytes=int(2 * copies / PACKED_SHARE)) == 4
    assert all(layer.packs for model in both for layer in model)
    unknown = models()
    monkeypatch.setattr("specreg.runtime.cpu_linear.available_memory", lambda: None)  # not Linux: no copies
    assert use_onednn_linears(*unknown, min_bytes=0) == 4
    assert not any(layer.packs for model in unknown for layer in model)
    monkeypatch.setattr(kind, "can_pack", False)  # a torch that cannot pack
    cannot = models()
    assert use_onednn_linears(*cannot, min_bytes=0, free_bytes=1 << 40) == 4
    assert not any(layer.packs for model in cannot for layer in model)


def test_available_memory_is_linux_memavailable(tmp_path):
    from specreg.runtime.cpu_linear import available_memory

    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24579420 kB\nMemFree:        20000000 kB\nMemAvailable:   22773164 kB\n")
    assert available_memory(str(meminfo)) == 22773164 * 1024
    meminfo.write_text("MemTotal:       24579420 kB\nMemAvailable:   unknown kB\n")
    assert available_memory(str(meminfo)) is None
    assert available_memory(str(tmp_path / "absent")) is None

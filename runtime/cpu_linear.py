"""The matrix products of the runtime's models on a CPU: oneDNN's where MKL's are slow.

A float32 ``nn.Linear`` on the CPU runs torch's MKL sgemm. A decode step multiplies one to a few
dozen rows by every weight matrix of the model, and there MKL's products were measured at a
fraction of what the machine reads: on this project's 2-core AMD EPYC machine they read the
weights at about 11 GB/s on one thread and no faster on two, where a plain sum over a tensor reads
28 GB/s on one thread and 51-57 on two. oneDNN's matmul, the kernel torch.compile's CPU backend
calls for linear layers (``torch.ops.mkldnn._linear_pointwise``, on the weight as it is, no packed
copy), ran a SmolLM2-135M decode step's products 1.6-2.1x faster on two threads
(docs/benchmarks-log.md). Same products, same float32 inputs and weights; the sums are accumulated in
another order, so logits differ from MKL's in the last bits, as they differ between any two
engines' kernels. Every forward of a loaded pair (target-only and speculative, any batch) runs on
the same kernel, which is what the equivalence check compares.

On an Intel CPU MKL runs its own tuned code and the models keep it: on a 2-core Intel Xeon VM
(AVX-512) a whole real-pair `validate` of the smoke set took 16.1-19.6 s on MKL against
18.9-22.0 s on oneDNN, three alternating pairs (docs/benchmarks-log.md). Small models (the demo's tiny
ones, whose weights stay in the caches), training (autograd), other devices and dtypes, and a
torch without oneDNN keep nn.Linear's own forward too.

oneDNN reads a weight fastest in its own blocked layout (``torch.ops.mkldnn._reorder_linear_weight``,
what torch.compile's weight freezing does): on the 2-core AMD EPYC machine a SmolLM2-135M step's
products took 24.9 / 25.3 / 59.2 ms at 1 / 7 / 35 rows on that copy against 27.8 / 37.4 / 82.2 ms
on the weight as it is (two threads), and the real pair's default-set `validate` 9-13% less time
(docs/benchmarks-log.md). The copy doubles the layers' memory, so it is made only while the copies fit
well within the memory the machine has available (PACKED_SHARE); elsewhere the products run on the
weight as it is. A layer makes its copy on its first product (validate's untimed warm-up) and
again when its weight is replaced or written in place.
"""

from __future__ import annotations

from functools import cache

# A model whose linear weights stay in the CPU's caches gains nothing from oneDNN and pays its
# dearer call (about 20 us against MKL's 5 on a 96-wide layer): oneDNN only for models whose
# weights are streamed from memory each step, well past any last-level cache.
STREAMED_BYTES = 64 << 20

# oneDNN lays a packed weight out for a batch of this many rows: on the AMD EPYC machine a layout
# for 1 row was slower than the plain weight at every row count, one for 8 to 64 rows faster at
# every row count from 1 to 35, so one layout serves single rows, batches and verifications
PACK_ROWS = 32
# packed copies are made while they add up to at most this share of the memory available when the
# models are loaded: the runtime's caches, activations and other processes keep the rest
PACKED_SHARE = 0.25


@cache
def mkl_is_native(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """True on an Intel CPU (``vendor_id: GenuineIntel``), where MKL's products are the faster
    ones; False elsewhere and where the vendor cannot be read (oneDNN then, as measured on AMD)."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as lines:
            for line in lines:
                if line.startswith("vendor_id"):
                    return line.partition(":")[2].strip() == "GenuineIntel"
    except OSError:
        pass
    return False


@cache
def onednn_linear_class():
    """nn.Linear whose inference forward on CPU float32 runs oneDNN's matmul, or None when this
    torch has no working oneDNN linear (then the models keep MKL's)."""
    import torch

    if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return None
    linear = torch.ops.mkldnn._linear_pointwise
    reorder = getattr(torch.ops.mkldnn, "_reorder_linear_weight", None)

    class OneDNNLinear(torch.nn.Linear):
        """A linear layer run by oneDNN on CPU float32 inference (runtime/cpu_linear.py); with
        ``packs`` set, on a packed copy of its weight."""

        packs = False

        def forward(self, input):  # noqa: A002 - nn.Linear's own argument name
            weight = self.weight
            if (input.device.type != "cpu" or input.dtype != torch.float32 or weight.dtype != torch.float32
                    or torch.is_grad_enabled() or input.numel() == 0):
                return super().forward(input)
            rows = input.reshape(-1, input.shape[-1]).contiguous()  # [n, in]
            weight = self.packed_weight() if self.packs else weight
            out = linear(rows, weight, self.bias, "none", [], "")  # [n, out]
            return out.view(*input.shape[:-1], out.shape[-1])

        def packed_weight(self):
            """The weight in oneDNN's layout for PACK_ROWS rows, made on first use and again
            whenever the weight was replaced or written in place (its version moves; a weight
            made under inference_mode has no version: only its replacement is seen)."""
            weight = self.weight
            key = (weight.data_ptr(), None if weight.is_inference() else weight._version)
            held = self.__dict__.get("_packed")
            if held is None or held[0] != key:
                held = self.__dict__["_packed"] = (key, reorder(weight.detach(), PACK_ROWS))
            return held[1]

    OneDNNLinear.__qualname__ = OneDNNLinear.__name__  # as the models print it
    OneDNNLinear.can_pack = reorder is not None
    probe = OneDNNLinear(8, 4)
    rows = torch.randn(3, 8)
    try:
        with torch.inference_mode():
            expected = torch.nn.functional.linear(rows, probe.weight, probe.bias)
            if not torch.allclose(probe(rows), expected, atol=1e-5):
                return None
    except RuntimeError:  # a build whose oneDNN cannot run this op
        return None
    if OneDNNLinear.can_pack:
        try:
            with torch.inference_mode():
                probe.packs = True
                OneDNNLinear.can_pack = bool(torch.allclose(probe(rows), expected, atol=1e-5))
        except RuntimeError:  # one that cannot pack: the weights as they are
            OneDNNLinear.can_pack = False
    return OneDNNLinear


def use_onednn_linears(*models, min_bytes: int | None = None, free_bytes: int | None = None) -> int:
    """Run the plain nn.Linear layers of ``models`` (None and non-modules skipped) on oneDNN when
    they are on the CPU in float32 and their weights add up to at least ``min_bytes`` in that model
    -> how many layers now do. min_bytes None: STREAMED_BYTES, and none on an Intel CPU
    (mkl_is_native). The layers keep their parameters; a model's layers also pack their weights
    (a copy each, made on first use) while the copies add up to at most PACKED_SHARE of
    ``free_bytes`` (None: the memory this machine has available now, available_memory). Other
    layers, devices, dtypes and smaller models are left as they are."""
    import torch

    if min_bytes is None:
        if mkl_is_native():
            return 0
        min_bytes = STREAMED_BYTES
    kind = onednn_linear_class()
    if kind is None:
        return 0
    swapped = 0
    room = None  # bytes the packed copies may still take, read once a model qualifies
    for model in models:
        if not isinstance(model, torch.nn.Module):
            continue
        layers = [module for module in model.modules() if type(module) is torch.nn.Linear
                  and module.weight.device.type == "cpu" and module.weight.dtype == torch.float32]
        weights = {module.weight.data_ptr(): module.weight.numel() * 4 for module in layers}  # tied ones once
        if sum(weights.values()) < min_bytes:
            continue
        if room is None:
            free = available_memory() if free_bytes is None else free_bytes
            room = int(PACKED_SHARE * free) if free is not None and kind.can_pack else 0
        copies = sum(module.weight.numel() * 4 for module in layers)  # a tied weight is packed once per layer
        packs = copies <= room
        room -= copies if packs else 0
        for module in layers:
            module.__class__ = kind
            module.packs = packs
        swapped += len(layers)
    return swapped


def available_memory(meminfo: str = "/proc/meminfo") -> int | None:
    """Bytes of memory available to new allocations without swapping (Linux's MemAvailable), or
    None where it cannot be read."""
    try:
        with open(meminfo, encoding="ascii", errors="replace") as lines:
            for line in lines:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None

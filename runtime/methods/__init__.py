"""One module per drafting method, each owning its loading and its drafter behind the protocol
of base.py: draft_model.py, ngram.py, suffix.py, eagle3.py, medusa.py, mtp.py, dflash.py, dspark.py
(block drafters: dspark.py reuses dflash.py's block forward). A module is named
as the registry names its method (specreg.core.methods.METHODS, the one table of methods) and
defines METHOD; the decode loop asks for it by name here and never branches on the name itself.

Adding a method: one MethodDescriptor in specreg/core/methods.py (what drafts, tree, prompt
lookup, exports) and one module here defining METHOD = base.Method(name, load, drafter[, check]);
a model-free one loads the target alone (as ngram.py) and batches a base.RowDrafter with
base.PerRowDrafter. tests/test_architecture.py checks both exist and that nothing else branches on
the name.
"""

from __future__ import annotations

from importlib import import_module

from specreg.errors import RuntimeConfigError


def drafting_method(name: str):
    """The runtime's METHOD of a registered method name -> base.DraftingMethod.
    RuntimeConfigError naming the known methods otherwise."""
    from specreg.core.methods import METHODS

    if name not in METHODS:
        raise RuntimeConfigError(f"method {name!r} unknown: use one of {', '.join(METHODS)}")
    return import_module(f"{__name__}.{name}").METHOD


def load_pair(target_path, draft_path=None, device: str = "cpu", dtype="float32", *,
              target_fingerprint=None, draft_fingerprint=None, method: str = "draft_model"):
    """Load a target and what drafts for it with `method` -> ModelPair, checked before any forward.

    draft_path: the draft model (draft_model), the head directory (eagle3, medusa), None for
    methods that draft without one (ngram; mtp reads the target's own layers). *_fingerprint: the
    ModelFingerprint each model was registered with; when given, what is loaded is checked against
    it as it is read (loading.load_model / load_tokenizer). On a CPU in float32, the linear layers
    of a model with 64 MB of linear weights or more run oneDNN's products, except on an Intel CPU,
    where MKL's are faster (cpu_linear.use_onednn_linears)."""
    from specreg.runtime.cpu_linear import use_onednn_linears
    from specreg.runtime.loading import resolve_device

    pair = drafting_method(method).load(target_path, draft_path, resolve_device(device), dtype,
                                        target_fingerprint=target_fingerprint, draft_fingerprint=draft_fingerprint)
    use_onednn_linears(pair.target, pair.draft)
    return pair

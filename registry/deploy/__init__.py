"""Deployment: engine exports (vLLM, SGLang, TensorRT-LLM, TGI, Kubernetes, Prometheus rules)
rendered from approved pair versions with their baselines, the signed pair lock those exports
carry and its deploy-time verification (``lock``: no torch, it runs in an init container), and
live observation of an engine's acceptance metrics against those baselines. One module per
engine in ``engines/`` (listed in ``engines.FORMATS``); ``exports`` keeps what they share and
imports them, never the other way round.

May import: ``registry.store``, ``registry.governance``, ``specreg.core``, ``specreg.errors``,
``specreg.templates``. Never validators or runtime.
"""

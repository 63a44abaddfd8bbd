"""Deployment: engine exports (vLLM, SGLang, TensorRT-LLM, TGI, Kubernetes, Prometheus rules)
rendered from approved pair versions with their baselines, the signed pair lock those exports
carry and its deploy-time verification (``lock``: no torch, it runs in an init container), and
live observation of an engine's acceptance metrics against those baselines.

May import: ``registry.store``, ``registry.governance``, ``specreg.core``, ``specreg.errors``,
``specreg.templates``. Never validators or runtime.
"""

"""The registry: what is registered, decided and deployed, and the record of it.

Sub-packages by concern, dependencies pointing down this list only:
- ``store``: entities, ORM, the Store (the only place that knows SQL), lifecycle, audit chain,
  migrations runner, persisted validation runs.
- ``governance``: policy, approvals, promotion, rollback, retirement, the gate.
- ``review``: the MLflow mirror (runs, model versions, aliases, approvals read back) and the
  validation reports it carries.
- ``deploy``: engine exports and live observation against the recorded baselines.

Nothing here imports ``specreg.validators`` or ``specreg.runtime`` (tests/test_architecture.py
enforces it): validation results reach the registry as ``specreg.core.types`` values, passed in
by the front door's use cases (``specreg.usecases``) and ``specreg.runtime_validation``.
"""

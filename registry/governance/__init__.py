"""Governance: the policy file, approvals (four-eyes), promotion, rollback, retirement and the
CI/CD gate with its JUnit/Markdown outputs.

May import: ``registry.store``, ``specreg.core``, ``specreg.golden_prompts`` (golden-set hashes),
``specreg.errors``. Never validators, runtime, review or deploy.
"""

"""Review in MLflow: the registry mirrored into MLflow runs, model versions and aliases, the
approvals reviewers set there read back, and the HTML/Markdown/JUnit validation reports.

May import: ``registry.store``, ``registry.governance`` (to record a UI approval under the same
rules), ``specreg.core``, ``specreg.settings``, ``specreg.errors``, ``specreg.templates``;
mlflow lazily. Never validators or runtime.
"""

"""What every part shares: value types (check results, model fingerprints and references) and
content fingerprinting of model directories (no tensor is loaded).

Imports nothing heavy (no torch, transformers, mlflow, SQLAlchemy) and nothing from registry,
validators or runtime, so each of those can import it (tests/test_architecture.py enforces it).
"""

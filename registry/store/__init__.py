"""Persistence: plain entities, their SQLAlchemy rows, the one session scope, lifecycle moves and
the hash-chained audit log; also the persisted validation runs and the schema migration runner.

May import: ``specreg.core``, ``specreg.errors``, ``specreg.settings``, ``specreg.migrations``.
Nothing else of the registry, and never validators or runtime.
"""

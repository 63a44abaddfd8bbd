"""Validation checks, one module per check, each returning a ``specreg.core.types.CheckResult``:
tokenizer, chat_template, integrity, memory (static: no forward pass); equivalence,
distribution, acceptance, performance (run the runtime); ``suite`` runs them in order.

May import: ``specreg.runtime``, ``specreg.core``, ``specreg.golden_prompts``, ``specreg.errors``.
Never the registry: a pair version comes in as a value, results go out as CheckResults.
"""

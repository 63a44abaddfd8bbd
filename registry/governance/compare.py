"""`specreg diff`: two versions side by side (models, fingerprints, config, validation figures)."""

from __future__ import annotations

from typing import Any

from specreg.core.baselines import in_engine_terms
from specreg.registry.governance.queries import finished_runs
from specreg.registry.store.entities import PairVersion
from specreg.registry.store.store import Store

def latest_validation_summary(store: Store, version: PairVersion) -> dict[str, Any] | None:
    """Figures of the newest finished validation of ``version`` (for diff), or None."""
    with store.session() as session:
        runs = finished_runs(session, version)
        if not runs:
            return None
        run = runs[0]
        baselines = in_engine_terms(run.baselines) or {}
        overall = baselines.get("overall") or {}
        return {
            "run": run.id, "status": run.status, "golden_set": run.golden_set, "golden_sha256": run.golden_sha256,
            "finished_at": run.finished_at.isoformat(timespec="seconds") if run.finished_at else None,
            "acceptance_rate": overall.get("acceptance_rate"),
            "mean_acceptance_length": overall.get("mean_acceptance_length"),
            "per_position_acceptance": overall.get("per_position_acceptance"),
            "categories": {cat: (figs or {}).get("acceptance_rate")
                           for cat, figs in (baselines.get("per_category") or {}).items()},
            "checks": {c.name: c.status for c in run.checks},
            # what the performance check measured: speculative vs target-only on the same prompts
            **{key: ((run.summary or {}).get("performance") or {}).get(key)
               for key in ("speedup", "tokens_per_s", "baseline_tokens_per_s", "recommended_k")},
        }


def diff(store: Store, a: PairVersion, b: PairVersion) -> list[dict[str, Any]]:
    """Side by side: models, fingerprints (weights, tokenizer, chat template, config), speculative
    config and validation figures of two versions (any pairs). Rows: section, field, a, b, same."""
    rows: list[dict[str, Any]] = []

    def add(section: str, name: str, value_a: Any, value_b: Any) -> None:
        rows.append({"section": section, "field": name, "a": value_a, "b": value_b, "same": value_a == value_b})

    add("version", "state", a.state.value, b.state.value)
    add("version", "registered_by", a.registered_by, b.registered_by)
    add("version", "binding_sha256", a.binding_sha256, b.binding_sha256)
    for role in ("target", "draft"):
        model_a, model_b = getattr(a, role), getattr(b, role)
        add(role, "reference", model_a.reference if model_a else None, model_b.reference if model_b else None)
        for key in ("weights_sha256", "tokenizer_sha256", "chat_template_sha256", "config_sha256", "architecture",
                    "vocab_size", "tokenizer_length", "parameter_count", "dtype", "max_position_embeddings"):
            add(role, key, getattr(model_a.fingerprint, key) if model_a else None,
                getattr(model_b.fingerprint, key) if model_b else None)
    for key, value_a in a.config.to_dict().items():
        add("config", key, value_a, b.config.to_dict()[key])
    summary_a, summary_b = latest_validation_summary(store, a) or {}, latest_validation_summary(store, b) or {}
    for key in ("run", "status", "golden_set", "golden_sha256", "finished_at", "acceptance_rate",
                "mean_acceptance_length", "per_position_acceptance", "speedup", "tokens_per_s",
                "baseline_tokens_per_s", "recommended_k"):
        add("validation", key, summary_a.get(key), summary_b.get(key))
    categories = list(dict.fromkeys([*(summary_a.get("categories") or {}), *(summary_b.get("categories") or {})]))
    for category in categories:
        add("validation", f"acceptance_rate.{category}", (summary_a.get("categories") or {}).get(category),
            (summary_b.get("categories") or {}).get(category))
    checks = list(dict.fromkeys([*(summary_a.get("checks") or {}), *(summary_b.get("checks") or {})]))
    for check in checks:
        add("checks", check, (summary_a.get("checks") or {}).get(check), (summary_b.get("checks") or {}).get(check))
    return rows

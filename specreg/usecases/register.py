"""Register: fingerprint both models and record version N+1 of a pair (or find the version that
already binds the same fingerprints and config). A registered version is immutable."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from specreg.core.digests import canonical_json, sha256_hex
from specreg.core.fingerprint import fingerprint_reference
from specreg.core.types import ModelRef
from specreg.errors import UsageError
from specreg.registry.store.entities import PairVersion, SpecConfig
from specreg.usecases.inputs import build_spec_config, check_name, check_text


@dataclass(frozen=True)
class RegisterResult:
    version: PairVersion
    created: bool  # False: the same fingerprints + config were already registered


def register(registry, name: str, *, target: str, draft: str | None = None, num_speculative_tokens: int | None = None,
             method: str = "draft_model", prompt_lookup_min: int | None = None, prompt_lookup_max: int | None = None,
             max_batch_size_for_speculation: int | None = None, notes: str | None = None,
             allow_pickle: bool = False, tree=None, allow_verifier_mismatch: bool = False,
             suffix: dict | None = None) -> RegisterResult:
    """Fingerprint both models and record version N+1 of ``name`` (see Registry.register)."""
    check_name(name)
    check_text("notes", notes)
    config = build_spec_config(method, num_speculative_tokens, prompt_lookup_min, prompt_lookup_max,
                               max_batch_size_for_speculation, has_draft=draft is not None, tree=tree,
                               suffix=suffix)
    if config.method.descriptor.drafts_with == "draft model" and draft is not None:
        refuse_head_as_draft(draft)
    # Fingerprint before touching the database: a bad model leaves no rows.
    target_ref = fingerprint_reference(target, allow_pickle=allow_pickle)
    draft_ref = fingerprint_reference(draft, allow_pickle=allow_pickle,
                                      require_tokenizer=not config.method.has_head) if draft is not None else None
    if config.method.has_head:
        head = describe_head(config, target_ref, draft_ref, allow_verifier_mismatch=allow_verifier_mismatch)
        config = dataclasses.replace(config, head=head)
        if config.method.descriptor.draft_length_from_head:
            from specreg.core.heads.dflash_checkpoint import block_draft_length

            config = dataclasses.replace(config, num_speculative_tokens=block_draft_length(
                head, config.num_speculative_tokens))
        registry.warnings.extend(head["fit"].get("warnings", ()))
    elif allow_verifier_mismatch:
        raise UsageError("--allow-verifier-mismatch applies to methods eagle3, medusa and mtp")
    version, created = registry.store.create_version(
        name=name, target=target_ref, draft=draft_ref, config=config,
        binding_sha256=binding(target_ref, draft_ref, config), actor=registry.user, notes=notes,
        allow_pickle=allow_pickle, model_files=model_files(target_ref, draft_ref),
    )
    return RegisterResult(version, created)


def refuse_head_as_draft(draft: str) -> None:
    """UsageError when the --draft folder of a draft_model pair holds a head, not a model."""
    from specreg.core.heads import head_in_place_of_a_model

    head = head_in_place_of_a_model(draft)
    if head is not None:
        what, method = head
        how = f"register it with --method {method}" if method else "specreg registers EAGLE-3, Medusa and MTP heads"
        raise UsageError(f"{os.path.join(draft, 'config.json')}: {what}, not a draft model (tokenizer files "
                         f"beside it do not make it one): {how}")


def binding(target: ModelRef, draft: ModelRef | None, config: SpecConfig) -> str:
    """The sha256 that identifies a version: both fingerprints and the config."""
    return sha256_hex(canonical_json({
        "target": target.fingerprint.to_dict(),
        "draft": draft.fingerprint.to_dict() if draft else None,
        "config": config.to_dict(),
    }))


def model_files(target: ModelRef, draft: ModelRef | None) -> dict[str, list]:
    """Every file engines may read of each model, not only those the fingerprint covers: an export
    whose file set differs is refused."""
    from specreg.registry.deploy.lock import list_model_files

    return {role: list(list_model_files(ref.path)) for role, ref in (("target", target), ("draft", draft)) if ref}


def describe_head(config: SpecConfig, target: ModelRef, draft: ModelRef | None, *,
                  allow_verifier_mismatch: bool) -> dict:
    """Read the head (or the target's MTP layers) and check it fits the target -> what the binding
    records: the head's description (no path: a location is not an identity) and the fit's
    findings. HeadMismatchError / ModelReferenceError name the field that does not fit."""
    from specreg.core.heads import read_head
    from specreg.core.heads.fit import check_head_fits

    method = config.method.value
    head = read_head(draft.path if draft is not None else target.path, method=method)
    fit = check_head_fits(head, target.path, target_reference=target.reference,
                          target_fingerprint=target.fingerprint, allow_verifier_mismatch=allow_verifier_mismatch)
    if config.method.descriptor.depth_limited_by_heads:
        depth = max(len(path) for path in config.tree) if config.tree else config.num_speculative_tokens
        if depth > head.num_heads:
            raise UsageError(f"{'tree depth' if config.tree else 'num_speculative_tokens'} {depth} needs "
                             f"{depth} Medusa heads; {draft.path} has medusa_num_heads = {head.num_heads}")
    description = {name: value for name, value in head.to_dict().items() if name != "path"}
    description["fit"] = {"aux_layer_ids": list(fit.aux_layer_ids), "verifier_matched": fit.verifier_matched,
                          "compared_token_strings": fit.compared_token_strings, "notes": list(fit.notes),
                          "allow_verifier_mismatch": allow_verifier_mismatch}
    if fit.warnings:  # only when there are: the binding of a pair without them is as before
        description["fit"]["warnings"] = list(fit.warnings)
    if fit.layers_fed is not None:
        description["fit"]["layers_fed"] = fit.layers_fed
    return description

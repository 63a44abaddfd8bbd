"""Export: deployment files for a validated and approved version, in one engine's terms, with the
pair lock that binds the files the engine loads (registry/deploy/exports.py renders, lock.py
builds the lock). The format's engine module and whether the version may be exported are resolved
once (exports.plan_export); everything written is read from that plan."""

from __future__ import annotations

from specreg.errors import PolicyViolation, UsageError
from specreg.registry.store.entities import PairVersion
from specreg.usecases.inputs import pair_ref


def export(registry, ref, fmt: str, *, out_dir: str | None = None, force: bool = False, overwrite: bool = False,
           template: str | None = None, options: dict | None = None, signing_key: str | None = None):
    """Render (and write under ``out_dir``) the files of format ``fmt`` for a version, with its pair
    lock (see Registry.export) -> [(file name, text)]."""
    from specreg.registry.deploy.exports import baseline_engine, plan_export
    from specreg.registry.deploy.lock import LOCK_FILE
    from specreg.registry.deploy.export_files import write_export
    from specreg.registry.governance.approvals import approval_standing
    from specreg.registry.governance.decisions import audit_check

    ref = pair_ref(ref)
    version = registry.get(ref)
    audited = audit_check(registry.store, version)
    if not audited.passed and not force:
        raise PolicyViolation(f"export of {version.label} refused: {audited.reason}")
    policy = registry.policy()  # one snapshot judges the approval, the engine baseline and the lock
    env = policy.environment(ref.environment) if ref.environment else None
    standing = approval_standing(registry.store, policy, version.name, version.version, env)
    baselines = export_baselines(registry, version, baseline_engine(fmt, options), policy)
    plan = plan_export(version, baselines, fmt, approved=standing.passed and audited.passed, force=force,
                       options=options, unapproved_reason=standing.reason)
    read_back(plan)
    lock = pair_lock(registry, plan, baselines, env, out_dir, overwrite, policy) if plan.engine.WRITES_LOCK else None
    audit_head = audited.details.get("audit_head") or registry.store.audit_head()
    files = render(plan, lock, template, signing_key, audit_head)
    if out_dir is not None:
        write_export(files, out_dir, overwrite=overwrite)
    if lock is not None and not signing_key:
        registry.warnings.append(f"{LOCK_FILE} is unsigned (no --signing-key / SPECREG_SIGNING_KEY): "
                                 f"`specreg verify` refuses it unless --allow-unsigned")
    return files


def read_back(plan) -> None:
    """The planned export's engine files (the shipped templates') read back as its engine parses
    them (engines/<engine>.py read_back) before anything is written or signed: ReadBackError (exit 1)
    names the file and key whose value is not the registered one. A format that makes model files
    reads those back as it makes them (llama.cpp's GGUF: engines/llamacpp.py converted_files)."""
    from specreg.registry.deploy import read_back as checks
    from specreg.registry.deploy.exports import render_files

    files = dict(render_files(plan))
    checks.check(plan, plan.engine.read_back(plan, files))


def export_baselines(registry, version: PairVersion, engine: str | None, policy) -> dict | None:
    """What an export carries of the version's newest passed validation (its baselines, golden
    set, when, and the memory check's estimate, which sizes the Kubernetes resource requests), in
    the terms of ``engine``, the engine whose measured baseline the format carries
    (exports.baseline_engine)."""
    from specreg.registry.store.validations import ValidationStore
    from specreg.usecases.engine_baselines import in_engine_terms

    run = ValidationStore(registry.store).latest_passed(version.name, version.version)
    baselines = None
    if run is not None and run.baselines is not None:
        memory = next((c.figures for c in run.checks if c.name == "memory" and c.figures), None)
        baselines = {**run.baselines, "golden_set": run.golden_set, "golden_sha256": run.golden_sha256,
                     "validated_at": run.finished_at.isoformat(timespec="seconds") + "Z",
                     "dtype": (run.environment or {}).get("dtype"),
                     **({"memory": memory} if memory else {})}
    return in_engine_terms(registry, version, engine, baselines, policy)


def pair_lock(registry, plan, baselines: dict | None, environment, out_dir: str | None, overwrite: bool,
              policy) -> dict:
    """The unsigned lock of a planned export (lock_for) with the ``baselines`` as recorded, binding the head layout it writes and the
    model files its engine loads where the export makes them (llamacpp's GGUF files: -o DIR)."""
    from specreg.registry.deploy.exports import draft_layout, lock_engine

    engine_layouts = None
    if plan.engine.WRITES_MODELS:
        if out_dir is None:
            raise UsageError(f"export format {plan.fmt} writes the model files the engine loads: give -o DIR")
        from specreg.registry.store.engine_artifacts import ArtifactRecords

        records = ArtifactRecords(registry.store, registry.user)
        engine_layouts = lambda: plan.engine.write_models(plan.pair_version, out_dir, plan.opts,  # noqa: E731
                                                          overwrite=overwrite, records=records)
    return lock_for(registry, plan.pair_version, engine=lock_engine(plan), baselines=baselines,
                    approved=plan.approved, environment=environment, draft_layout=draft_layout(plan),
                    engine_layouts=engine_layouts, policy=policy)


def render(plan, lock: dict | None, template: str | None, signing_key: str | None, audit_head: str):
    """The export's files and, beside them, its lock, signed with ``signing_key`` when given. The
    engine files go under the lock's signature (serve script, config, each container's args):
    rendered once to take their digests, then again around the signed lock (the Kubernetes
    manifest carries it; the files do not depend on the lock's content)."""
    from specreg.registry.deploy.exports import render_files
    from specreg.registry.deploy.lock import LOCK_FILE, exported_digests, lock_text, sign_lock

    if lock is None:
        return render_files(plan, template_path=template, audit_head=audit_head)
    placeholder = {**lock, "signature": {} if signing_key else None}
    lock["exported"] = exported_digests(render_files(plan, template_path=template, lock=placeholder,
                                                     audit_head=audit_head))
    lock = sign_lock(lock, signing_key) if signing_key else lock
    files = render_files(plan, template_path=template, lock=lock, audit_head=audit_head)
    return [*files, (LOCK_FILE, lock_text(lock))]


def lock_for(registry, version: PairVersion, *, engine: dict | None, baselines: dict | None, approved: bool,
             environment=None, draft_layout: tuple | None = None, engine_layouts=None,
             signing_key: str | None = None, policy=None) -> dict:
    """The lock of ``version`` (registry.deploy.lock.build_lock), signed when ``signing_key`` is
    given (see Registry.pair_lock); ``policy``: the policy of record as the command read it
    (default: read here)."""
    from specreg.registry.deploy.lock import build_lock, file_set_changes, sign_lock
    from specreg.registry.governance import approvals
    from specreg.registry.governance.queries import fingerprint_changes

    changes = fingerprint_changes(version) + file_set_changes(version)
    if changes:
        raise PolicyViolation(f"{version.label}: the models changed since registration ({'; '.join(changes)}); "
                              f"no lock is written for files that were not validated")
    policy = registry.policy() if policy is None else policy
    env = environment or approvals.export_environment(policy)
    # the signed decisions that count now, each with its signature: verify checks them again
    # against the keyring the platform mounts, without the registry
    signed = [{"decision": a.decision, "actor": a.actor, "at": a.created_at.isoformat(timespec="seconds") + "Z",
               "scope": a.scope, "key_id": a.key_id, "note": a.note, "signature": a.signature}
              for a in approvals.counted_approvals(registry.store, policy, version.name, version.version)]
    approval_policy = {"environment": env.name, "approvals_required": env.approvals_required,
                       "approvers": list(env.approvers), "policy_sha256": policy.sha256}
    lock = build_lock(version, engine=engine, baselines=baselines, approvals=signed, approval_policy=approval_policy,
                      audit_head={"hash": registry.store.audit_head()}, approved=approved,
                      exported_by=registry.user, draft_layout=draft_layout,
                      engine_layouts=engine_layouts() if engine_layouts else None)
    return sign_lock(lock, signing_key) if signing_key else lock

"""Governance: the gate. Every condition a pair version must meet to hold an environment
(audit chain, validation, golden set, fingerprints, checks, baselines, acceptance, approval),
evaluated read-only for `specreg gate` and inside promote's transaction (pointer_moves.py)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from specreg.core.baselines import drift_floor, schedule_note
from specreg.core.statuses import GateVerdict, RunStatus
from specreg.core.user_names import same_user
from specreg.registry.governance.approvals import approval_condition
from specreg.registry.governance.engine_gate import engine_baseline_conditions
from specreg.registry.governance.floors import floor_conditions
from specreg.registry.governance.policy import EnvironmentPolicy, Policy
from specreg.registry.governance.queries import (Condition, finished_runs, fingerprint_changes, overall_figures,
                                                 pointer_problem)
from specreg.registry.store import pointers
from specreg.registry.store.entities import AuditEvent, PairState, PairVersion, ValidationRun
from specreg.registry.store.store import Session, Store, utcnow, verified_chain

if TYPE_CHECKING:
    from specreg.golden_prompts.records import GoldenRef


@dataclass(frozen=True)
class GateResult:
    """Whether ``pair@version`` may hold ``environment`` now, condition by condition."""

    pair: str
    version: int
    environment: str
    policy_source: str
    conditions: tuple[Condition, ...]
    validation_run_id: int | None
    audit_head: str | None = None  # the verified chain's newest hash when judged: anchor it
    policy_version: int | None = None  # the policy of record's version (None: a file, previewed)
    policy_sha256: str | None = None
    preview: dict[str, Any] | None = None  # the same gate under a policy file: shown, never decides
    binding_sha256: str | None = None  # the binding judged: a pipeline checks its pair lock names the same

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.conditions)

    @property
    def reasons(self) -> list[str]:
        """One line per failed condition that was judged (``unmet``): ``name: reason``."""
        return [f"{c.name}: {c.reason}" for c in unmet(self.conditions)]

    def to_dict(self) -> dict[str, Any]:
        return {
            "pair": self.pair, "version": self.version, "environment": self.environment,
            "passed": self.passed, "verdict": (GateVerdict.PASS if self.passed else GateVerdict.REFUSED).value,
            "policy": self.policy_source, "policy_version": self.policy_version, "policy_sha256": self.policy_sha256,
            "validation_run_id": self.validation_run_id, **({"preview": self.preview} if self.preview else {}),
            "audit_head": self.audit_head, "binding_sha256": self.binding_sha256, "reasons": self.reasons,
            "conditions": [c.to_dict() for c in self.conditions],
        }


NOT_JUDGED = "not_judged"  # a Condition's details key: the condition whose failure left it unjudged


def unmet(conditions) -> list[Condition]:
    """The failed conditions that were judged, in the order evaluated: the first is the root
    cause. A condition left unjudged by another's failure (the checks, baselines and floors
    while no validation on the policy's golden set exists) still fails the gate, but is not
    listed as unmet: it may well be met on another golden set."""
    return [c for c in conditions if not c.passed and NOT_JUDGED not in c.details]


def not_judged(name: str, golden_set: str) -> Condition:
    """``name`` unjudged for want of a passed validation on ``golden_set``."""
    return Condition(name, False, f"not judged: needs a passed validation on golden set {golden_set}",
                     {NOT_JUDGED: "validation"})


def replayed_state(row: PairVersion, chain: list[AuditEvent]) -> tuple[str | None, str | None]:
    """The state of ``row`` replayed from its events in the verified chain, and the first
    disagreement between the row and its events (None: they agree). The first event must be
    the registration, by the recorded registrant, of the recorded binding."""
    mine = [e for e in chain if e.pair_name == row.name and e.version == row.version]
    label = row.label
    if not mine or mine[0].action != "register":
        return None, f"{label} has no registration event in the audit chain (a row written outside specreg)"
    register = mine[0]
    if (register.details or {}).get("binding_sha256") != row.binding_sha256:
        return None, f"{label}: binding differs from its registration event"
    if not same_user(register.actor, row.registered_by):
        return None, (f"{label}: registrant {row.registered_by!r} differs from its registration event's actor "
                      f"{register.actor!r}")
    state = mine[-1].to_state
    if state != row.state.value:
        return state, f"{label} is {row.state.value} in its row but {state} by its audit events"
    return state, None


def audit_condition(row: PairVersion, chain: list[AuditEvent], problem: str | None) -> Condition:
    """The audit chain links, and the version's row agrees with what its events say."""
    if problem is not None:
        return Condition("audit", False, f"audit log broken: {problem}")
    _, disagreement = replayed_state(row, chain)
    if disagreement is not None:
        return Condition("audit", False, disagreement)
    head = chain[-1].event_hash if chain else None
    return Condition("audit", True, f"chain of {len(chain)} event(s) intact; state {row.state.value} as its events say",
                     {"audit_head": head})


def evaluate(session: Session, row: PairVersion, env: EnvironmentPolicy, policy: Policy, *, golden: GoldenRef,
             changes: list[str] | None, holder: PairVersion | None, now: datetime) -> tuple[list[Condition], ValidationRun | None]:
    """Every condition for ``row`` to hold environment ``env``, read inside ``session``.

    ``golden``: the policy's golden set as the command resolved it (queries.golden_reference);
    ``changes``: fingerprint_changes() (None: the files were not re-hashed, for a summary that
    must not read every weight file again); ``holder``: the version holding the environment now
    (its baseline is a reference). Returns (conditions, the validation run they are based on)."""
    label = row.label
    conditions: list[Condition] = []
    chain, problem = verified_chain(session)
    conditions.append(audit_condition(row, chain, problem))
    conditions.append(Condition("not_retired", row.state is not PairState.RETIRED,
                                f"{label} is retired" if row.state is PairState.RETIRED
                                else f"{label} is {row.state.value}"))

    runs = finished_runs(session, row, chain)
    # a run counts when it validated the very content resolved now (the hash covers the set's name,
    # version and records); one recorded under the set's name with another hash counts for nothing
    # and only says why: the set changed since
    run = next((r for r in runs if r.golden_sha256 == golden.sha256), None)
    stale = next((r for r in runs if r.golden_set == golden.name), None) if run is None else None
    shown = run or stale  # the run the validation condition reports
    if shown is None:
        if runs:
            reason = (f"run {runs[0].id} used golden set {runs[0].golden_set}; the policy asks for "
                      f"{env.golden_set}")
        else:
            reason = f"{label} is not validated on golden set {env.golden_set} (no validation run yet)"
        conditions.append(Condition("validation", False, reason, {"golden_set": env.golden_set}))
    elif shown.status != RunStatus.PASSED:
        conditions.append(Condition("validation", False,
                                    f"the latest validation of {label} on {env.golden_set} (run {shown.id}) {shown.status}",
                                    {"run": shown.id, "status": shown.status, "golden_set": env.golden_set}))
    else:
        conditions.append(Condition("validation", True, f"run {shown.id} passed on {env.golden_set}",
                                    {"run": shown.id,
                                     "finished_at": shown.finished_at.isoformat() if shown.finished_at else None}))

    if stale is not None:
        conditions.append(Condition("golden_set", False,
                                    f"golden set {env.golden_set} changed since run {stale.id} "
                                    f"({stale.golden_sha256[:12]} -> {golden.sha256[:12]}): validate again",
                                    {"validated": stale.golden_sha256, "now": golden.sha256}))
    elif run is None:
        conditions.append(not_judged("golden_set", env.golden_set))
    else:
        conditions.append(Condition("golden_set", True, f"same golden set hash {golden.sha256[:12]}",
                                    {"sha256": golden.sha256}))

    if changes:
        conditions.append(Condition("fingerprints", False, "models changed since registration: " + ", ".join(changes),
                                    {"changes": changes}))
    elif run is not None and run.binding_sha256 != row.binding_sha256:
        conditions.append(Condition("fingerprints", False, f"run {run.id} validated another binding "
                                    f"({run.binding_sha256[:12]}, version binds {row.binding_sha256[:12]})"))
    elif changes is None:
        conditions.append(Condition("fingerprints", True, "model files not re-hashed for this summary (gate and "
                                    "promote re-hash them)", {"rehashed": False}))
    else:
        conditions.append(Condition("fingerprints", True, "weights, tokenizer, chat template and config unchanged"))

    if env.max_validation_age_days is not None:
        finished = run.finished_at if run is not None else None
        if finished is None:
            conditions.append(not_judged("validation_age", env.golden_set))
        else:
            age_days = (now - finished) / timedelta(days=1)
            fresh = age_days <= env.max_validation_age_days
            conditions.append(Condition(
                "validation_age", fresh,
                f"run {run.id} is {age_days:.1f} days old (limit {env.max_validation_age_days:g})",
                {"age_days": round(age_days, 3), "limit_days": env.max_validation_age_days}))

    checks = {c.name: c for c in run.checks} if run is not None else {}
    accepted = ("pass", "warn") if env.allow_warnings else ("pass",)
    for name in env.checks_for(row.config.method.value):  # per pair kind where the policy says so
        check = checks.get(name)
        if run is None:
            conditions.append(not_judged(f"check.{name}", env.golden_set))
        elif check is None:
            conditions.append(Condition(f"check.{name}", False, f"run {run.id} did not run check {name}"))
        else:
            conditions.append(Condition(f"check.{name}", check.status in accepted,
                                        f"{check.status}: {check.summary}", {"status": check.status}))

    figures = overall_figures(run) if run is not None and run.status == RunStatus.PASSED else None
    if run is None or run.status != RunStatus.PASSED:
        # a failed or missing validation is the cause: what it would have measured is not judged
        conditions.append(not_judged("baselines", env.golden_set))
    else:
        conditions.append(Condition("baselines", figures is not None,
                                    f"run {run.id} recorded acceptance baselines" if figures
                                    else f"no acceptance baselines recorded in run {run.id}",
                                    {"overall": figures} if figures else {}))
    conditions.append(acceptance_condition(session, row, run, figures, env, golden.sha256, holder, chain))
    conditions.extend(engine_baseline_conditions(session, row, env, golden_sha256=golden.sha256, now=now, policy=policy,
                                                 chain=chain))
    events = [e for e in chain if e.pair_name == row.name and e.version == row.version]
    floors = floor_conditions(run, env, overall_figures(run) if run is not None else None, events)
    conditions += [not_judged(c.name, env.golden_set) if run is None and not c.passed else c for c in floors]
    conditions.append(approval_condition(session, row, env, policy, chain))
    return conditions, shown


def acceptance_condition(session: Session, row: PairVersion, run: ValidationRun | None,
                         figures: dict[str, float] | None, env: EnvironmentPolicy, golden_sha256: str,
                         holder: PairVersion | None, chain: list[AuditEvent]) -> Condition:
    """Acceptance >= baseline * (1 - tolerance) against (a) the version's own earlier passed run
    on the same golden set (drift) and (b) the environment's current holder."""
    if figures is None:
        if run is None or run.status != RunStatus.PASSED:
            return not_judged("acceptance", env.golden_set)
        return Condition("acceptance", False, f"run {run.id} recorded no acceptance figures to compare")
    references: list[tuple[str, ValidationRun]] = []
    earlier = [r for r in finished_runs(session, row, chain)
               if r.id < run.id and r.status == RunStatus.PASSED and r.golden_sha256 == golden_sha256]
    if earlier and overall_figures(earlier[0]):
        references.append((f"run {earlier[0].id} of this version", earlier[0]))
    if holder is not None and holder.id != row.id:
        holder_runs = [r for r in finished_runs(session, holder, chain)
                       if r.status == RunStatus.PASSED and r.golden_sha256 == golden_sha256]
        if holder_runs and overall_figures(holder_runs[0]):
            references.append((f"{env.name} holder {holder.label}", holder_runs[0]))
    if not references:
        return Condition("acceptance", True,
                         f"acceptance rate {figures['acceptance_rate']:.3f}; no earlier baseline on this golden set",
                         {"figures": figures})
    drops: list[str] = []
    compared: list[dict[str, Any]] = []
    not_compared: list[str] = []
    notes: list[str] = []
    k = (run.baselines or {}).get("k")
    for source, reference in references:
        baseline = overall_figures(reference)
        if note := schedule_note(reference.baselines, source):
            notes.append(note)
        if "mean_acceptance_length" in figures and "mean_acceptance_length" not in baseline:
            not_compared.append(f"tau not compared with {source}: recorded before the engines' definition")
        # tau counts up to k + 1 tokens a step: comparable only at the same k; alpha-hat always
        same_k = k is not None and (reference.baselines or {}).get("k") == k
        for key, value in figures.items():
            if key not in baseline or key == "mean_acceptance_length" and not same_k:
                continue
            floor = drift_floor(key, baseline[key], env.acceptance_tolerance)
            compared.append({"reference": source, "figure": key, "value": value, "baseline": baseline[key], "floor": floor})
            if value < floor:
                drops.append(f"{key} {value:.3f} < {floor:.3f} ({source} {baseline[key]:.3f} - {env.acceptance_tolerance:.0%})")
    details = {"compared": compared, "not_compared": not_compared, "notes": notes}
    if drops:
        return Condition("acceptance", False, "; ".join(drops + not_compared + notes), details)
    return Condition("acceptance", True,
                     f"acceptance rate {figures['acceptance_rate']:.3f} within {env.acceptance_tolerance:.0%} of "
                     + ", ".join(source for source, _ in references) + "".join(f"; {n}" for n in not_compared + notes),
                     details)


def audit_check(store: Store, version: PairVersion) -> Condition:
    """``audit_condition`` of one version in a read session (for export and sync)."""
    with store.session() as session:
        row = store.pair_version(session, version.name, version.version)
        chain, problem = verified_chain(session)
        return audit_condition(row, chain, problem)


def gate(store: Store, policy: Policy, version: PairVersion, environment: str, *, golden: GoldenRef,
         rehash: bool = True) -> GateResult:
    """Evaluate every condition for ``version`` to hold ``environment`` (read only). ``golden``:
    the environment's golden set as the command resolved it (queries.golden_reference). ``rehash``
    False: the model files are not fingerprinted again (the MLflow mirror's summary, written on
    every change, says so in its fingerprints condition); the gate and promote always re-hash."""
    env = policy.environment(environment)
    changes = fingerprint_changes(version) if rehash else None
    with store.session() as session:
        row = store.pair_version(session, version.name, version.version)
        pointer = pointers.pointer(session, version.name, environment)
        chain, _ = verified_chain(session)
        if pointer is not None and pointer_problem(pointer, chain):
            pointer = None  # a pointer row the chain does not vouch for is no reference
        holder = store.pair_version(session, version.name, pointer.version) \
            if pointer and pointer.version is not None else None
        conditions, run = evaluate(session, row, env, policy, golden=golden, changes=changes, holder=holder,
                                   now=utcnow())
        head = next((c.details.get("audit_head") for c in conditions if c.name == "audit"), None)
        return GateResult(version.name, version.version, environment, policy.source, tuple(conditions),
                          run.id if run is not None else None, head, policy.version, policy.sha256,
                          binding_sha256=version.binding_sha256)

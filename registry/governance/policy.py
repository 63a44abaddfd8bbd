"""The promotion policy: which environments exist and what a pair version needs to hold one.

A policy is a TOML (read with tomllib) or YAML (``.yaml``/``.yml``) document. What governs is the
registry's policy of record (registry/governance/policy_record.py): a document proposed with
`specreg policy propose FILE` that governs once the four-eyes rule of the policy before it is
met; until a first one is recorded the built-in ``DEFAULT_POLICY_TOML`` below applies. A file
given with ``--policy`` only previews. Top-level keys are defaults for every environment; each
``[environments.NAME]`` table may override them:

    golden_set              the golden set (shipped name or path) the validation must have used
    required_checks         checks of that validation that must have passed
    required_checks_by_method
                            a table method -> checks, replacing required_checks for pairs of that
                            kind: a head pair (eagle3, medusa, mtp) drafts inside the target's own
                            chat context and an ngram pair has no draft model, so their validation
                            skips the checks that compare two tokenizers or templates. A method not
                            in the table uses required_checks; a skipped check never counts as passed.
    allow_warnings          accept "warn" (e.g. an fp16 near-tie) for a required check
    approval_required       an approval by someone other than the registrant is needed
    approvers               who may approve for this environment; [] = anyone but the registrant
    approvals_required      how many people other than the registrant must have signed an
                            approval (default 1: four-eyes)
    acceptance_tolerance    relative drop of acceptance allowed against the baseline (0.1 = 10%)
    max_validation_age_days a validation older than this no longer counts (omit: no limit)
    min_acceptance_rate     the validation's acceptance rate must reach this (omit: no floor). The
                            first validated version sets the baseline later versions are compared
                            with: without a floor a version with acceptance 0 would pass and make
                            every later regression check compare against 0
    min_speedup             the validation's measured speedup at the pair's k must reach this
                            (omit: no floor); `promote --allow-slower REASON` makes an explicit
                            exception, recorded in the audit log, that the gate then honours
    required_engine_baselines
                            engines (llamacpp, vllm, sglang) that must have validated the version
                            (`specreg validate NAME@V --engine ENGINE`) on the golden set, on its
                            binding, with parity and equivalence in the engine passing (and within
                            max_validation_age_days); exports and alert rules for an engine then use
                            that engine's baseline. Default [] (none required).

A top-level ``[identity]`` table says who may act:

    allow_claimed_user      on PostgreSQL the actor is the authenticated database role
                            (session_user); true lets ``--user``/``$SPECREG_USER`` name someone
                            else, recorded as claimed beside the role in every audit event
                            (default false: refused). On SQLite identity is advisory: whatever
                            --user / $SPECREG_USER / the OS user says (no authentication).

A top-level ``[keyring]`` table says who may enrol approvers' keys:

    enrollers               the people who may run `specreg keys enrol` (default ["admin"]); a
                            key counts only while its enroller is named here, and never for a
                            pair its enroller registered

Unknown keys are errors, so a misspelt ``aproval_required`` cannot silently weaken the policy.
"""

from __future__ import annotations

import math
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specreg.core.documents import depth_problem, yaml_problem
from specreg.core.user_names import normalize_user
from specreg.errors import IdentityError, NotFoundError, UsageError

MAX_POLICY_BYTES = 1024 * 1024  # a policy is a few environments: a megabyte is plenty
BUILTIN_SOURCE = "built-in default"

DEFAULT_POLICY_TOML = """\
# specreg built-in policy (in effect until the registry has a policy of record: `specreg policy propose`)
golden_set = "default"
required_checks = ["integrity", "tokenizer", "chat_template", "equivalence", "acceptance"]
allow_warnings = false
acceptance_tolerance = 0.10
max_validation_age_days = 30
# required_engine_baselines = ["llamacpp"]   # engines that must have validated a version first

[required_checks_by_method]
# no second tokenizer or chat template to compare: tokenizer is the head's fit to the target's
# vocabulary for heads; an ngram or suffix pair has neither check
ngram = ["integrity", "equivalence", "acceptance"]
eagle3 = ["integrity", "tokenizer", "equivalence", "acceptance"]
medusa = ["integrity", "tokenizer", "equivalence", "acceptance"]
mtp = ["integrity", "tokenizer", "equivalence", "acceptance"]
suffix = ["integrity", "equivalence", "acceptance"]

[identity]
allow_claimed_user = false   # PostgreSQL: the actor is the database role; SQLite: advisory

[keyring]
enrollers = ["admin"]   # who may enrol an approver's public key (`specreg keys enrol`)

[environments.staging]
approval_required = false

[environments.production]
approval_required = true
approvers = []   # anyone but the registrant (four-eyes)
approvals_required = 1   # signed approvals by distinct people other than the registrant
min_acceptance_rate = 0.3   # a draft accepted less often is no baseline to hold later versions to
min_speedup = 1.0   # never slower than the target alone at its k (else promote --allow-slower REASON)
"""

ENVIRONMENT_KEYS = {
    "golden_set": str, "required_checks": list, "allow_warnings": bool, "approval_required": bool,
    "approvers": list, "acceptance_tolerance": (int, float), "max_validation_age_days": (int, float),
    "required_checks_by_method": dict, "approvals_required": int,
    "min_acceptance_rate": (int, float), "min_speedup": (int, float),
    "required_engine_baselines": list,
}
ENVIRONMENT_DEFAULTS: dict[str, Any] = {
    "golden_set": "default", "required_checks": ["integrity", "equivalence", "acceptance"],
    "allow_warnings": False, "approval_required": False, "approvers": [],
    "acceptance_tolerance": 0.10, "max_validation_age_days": None, "required_checks_by_method": {},
    "approvals_required": 1,
    "min_acceptance_rate": None, "min_speedup": None,
    "required_engine_baselines": [],
}
DEFAULT_ENROLLERS = ("admin",)


@dataclass(frozen=True)
class EnvironmentPolicy:
    """What a version needs to hold one environment."""

    name: str
    golden_set: str
    required_checks: tuple[str, ...]
    allow_warnings: bool
    approval_required: bool
    approvers: tuple[str, ...]  # empty: anyone but the registrant
    acceptance_tolerance: float
    max_validation_age_days: float | None
    required_checks_by_method: dict[str, tuple[str, ...]] = field(default_factory=dict)
    required_engine_baselines: tuple[str, ...] = ()  # engines whose baseline a version needs first
    approvals_required: int = 1
    min_acceptance_rate: float | None = None  # the validation's acceptance rate must reach it
    min_speedup: float | None = None  # the validation's measured speedup must reach it (or an exception)

    def floors_text(self) -> list[str]:
        """The floors of this environment in words, for `specreg policy show`."""
        lines = []
        if self.min_acceptance_rate is not None:
            lines.append(f"{self.name}: the validation's acceptance rate must be at least {self.min_acceptance_rate:g} "
                         "(min_acceptance_rate): the first validated version sets the baseline later versions are "
                         "compared with, so a draft that is rarely accepted would make that comparison meaningless")
        if self.min_speedup is not None:
            lines.append(f"{self.name}: the validation's measured speedup at the pair's k must be at least "
                         f"{self.min_speedup:g}x (min_speedup); `specreg promote NAME@VERSION --to {self.name} "
                         "--allow-slower REASON` makes an explicit exception, recorded in the audit log")
        return lines

    def checks_for(self, method: str) -> tuple[str, ...]:
        """The checks a pair of kind `method` (draft_model, ngram, eagle3, ...) must have passed."""
        return self.required_checks_by_method.get(method, self.required_checks)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "golden_set": self.golden_set, "required_checks": list(self.required_checks),
            "required_checks_by_method": {method: list(checks) for method, checks in
                                          self.required_checks_by_method.items()},
            "allow_warnings": self.allow_warnings, "approval_required": self.approval_required,
            "approvers": list(self.approvers), "acceptance_tolerance": self.acceptance_tolerance,
            "max_validation_age_days": self.max_validation_age_days, "approvals_required": self.approvals_required,
            "min_acceptance_rate": self.min_acceptance_rate, "min_speedup": self.min_speedup,
            "required_engine_baselines": list(self.required_engine_baselines),
        }


@dataclass(frozen=True)
class Policy:
    """All environments of one policy; ``source`` names the file (or the built-in default)."""

    environments: dict[str, EnvironmentPolicy]
    source: str
    allow_claimed_user: bool = False  # [identity]: --user may differ from the PostgreSQL role
    enrollers: tuple[str, ...] = DEFAULT_ENROLLERS  # [keyring]: who may enrol approvers' keys
    # the policy of record's version in the registry (0: the built-in default, in effect until a
    # first policy is recorded); None for a file read to preview it
    version: int | None = None

    def environment(self, name: str) -> EnvironmentPolicy:
        """The policy of environment ``name``; NotFoundError names the known ones."""
        if name not in self.environments:
            known = ", ".join(sorted(self.environments)) or "none"
            raise NotFoundError(f"unknown environment {name!r}: policy {self.source} defines {known}")
        return self.environments[name]

    def validation_environment(self) -> EnvironmentPolicy:
        """The environment whose golden set and tolerance `specreg validate` uses unless told
        otherwise: the last one the policy lists (production in the built-in policy), so that
        one validation serves the promotion that asks the most of it."""
        return list(self.environments.values())[-1]

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "version": self.version,
                "identity": {"allow_claimed_user": self.allow_claimed_user},
                "keyring": {"enrollers": list(self.enrollers)},
                "environments": {n: e.to_dict() for n, e in self.environments.items()}}

    @property
    def sha256(self) -> str:
        """The hash of what the policy says (not where it was read from): signed into approvals."""
        from specreg.core.digests import canonical_json, sha256_hex

        return sha256_hex(canonical_json({k: v for k, v in self.to_dict().items() if k not in ("source", "version")}))

    def identity_text(self) -> str:
        """How the acting user is established under this policy, for `specreg policy show`."""
        claimed = ("--user/$SPECREG_USER may name someone else (recorded as claimed beside the role)"
                   if self.allow_claimed_user else "--user/$SPECREG_USER naming anyone else is refused")
        return ("identity: on PostgreSQL the actor is the authenticated database role (session_user); "
                f"{claimed}. On SQLite identity is advisory: whatever --user, $SPECREG_USER or the OS user "
                "says, with no authentication behind it.")


def load_policy(path: str | os.PathLike | None = None) -> Policy:
    """The policy in the file ``path``, or the built-in default when None. A file previews a
    policy (`policy show --policy`, `gate --policy`) or is proposed as the next policy of record;
    what governs is the registry's policy of record (registry/governance/policy_record.py).

    Raises UsageError (one line naming the file and key) for a missing or malformed file."""
    if path is None:
        return builtin_policy()
    text, policy_format = read_policy_file(path)
    return parse_policy_text(text, policy_format, str(Path(path).expanduser()))


def builtin_policy() -> Policy:
    return parse_policy(tomllib.loads(DEFAULT_POLICY_TOML), BUILTIN_SOURCE)


def read_policy_file(path: str | os.PathLike) -> tuple[str, str]:
    """(the text of the policy file ``path``, "toml" or "yaml"), read with a bound: a FIFO or
    /dev/zero is refused with one line, never read to the end."""
    from specreg.core.files import read_text_bounded

    file = Path(path).expanduser()
    if not file.exists() and not file.is_symlink():
        raise UsageError(f"policy file {file} not found")
    text = read_text_bounded(file, MAX_POLICY_BYTES, "policy file", UsageError)
    return text, "yaml" if file.suffix in (".yaml", ".yml") else "toml"


def parse_policy_text(text: str, policy_format: str, source: str) -> Policy:
    """Check and build a Policy from a TOML or YAML document's text; UsageError naming
    ``source`` and the key otherwise."""
    if policy_format == "yaml":
        import yaml

        try:
            problem = yaml_problem(text)  # before anything is built: aliases could expand to gigabytes
            if problem:
                raise UsageError(f"policy file {source}: {problem}")
            document = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else "invalid YAML"
            raise UsageError(f"policy file {source}: invalid YAML ({first})") from None
    else:
        try:
            document = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise UsageError(f"policy file {source}: invalid TOML ({' '.join(str(exc).split())})") from None
        except RecursionError:
            raise UsageError(f"policy file {source}: invalid TOML (nested too deeply)") from None
    problem = depth_problem(document)
    if problem:
        raise UsageError(f"policy file {source}: {problem}")
    return parse_policy(document, source)


def parse_policy(document: Any, source: str) -> Policy:
    """Check and build a Policy from a parsed TOML/YAML document."""
    if not isinstance(document, dict):
        raise UsageError(f"policy {source}: expected a table/mapping at the top")
    defaults = dict(ENVIRONMENT_DEFAULTS)
    for key, value in document.items():
        if key in ("environments", "identity", "keyring"):
            continue
        defaults[key] = check_value(source, key, value)
    identity = document.get("identity", {})
    if not isinstance(identity, dict) or set(identity) - {"allow_claimed_user"}:
        raise UsageError(f"policy {source}: [identity] takes only allow_claimed_user = true|false")
    allow_claimed_user = identity.get("allow_claimed_user", False)
    if not isinstance(allow_claimed_user, bool):
        raise UsageError(f"policy {source}: identity.allow_claimed_user = {allow_claimed_user!r} must be true or false")
    keyring = document.get("keyring", {})
    if not isinstance(keyring, dict) or set(keyring) - {"enrollers"} \
            or not isinstance(keyring.get("enrollers", []), list) \
            or not all(isinstance(v, str) and v for v in keyring.get("enrollers", [])):
        raise UsageError(f"policy {source}: [keyring] takes only enrollers = [\"name\", ...]")
    try:
        enrollers = tuple(normalize_user(v, what="enroller") for v in keyring.get("enrollers", DEFAULT_ENROLLERS))
    except IdentityError as exc:
        raise UsageError(f"policy {source}: keyring.enrollers: {exc}") from None
    environments = document.get("environments")
    if not isinstance(environments, dict) or not environments:
        raise UsageError(f"policy {source}: needs at least one [environments.NAME] table")
    built: dict[str, EnvironmentPolicy] = {}
    for name, table in environments.items():
        if not isinstance(name, str) or not name or len(name) > 32 or not name[0].isalpha() \
                or not all(c.isalnum() or c in "_-" for c in name) or name != name.lower():
            raise UsageError(f"policy {source}: invalid environment name {name!r} (a-z 0-9 _ -, starting with a letter)")
        if table is None:
            table = {}
        if not isinstance(table, dict):
            raise UsageError(f"policy {source}: environments.{name} must be a table/mapping")
        merged = dict(defaults)
        for key, value in table.items():
            merged[key] = check_value(source, f"environments.{name}.{key}", value, key)
        built[name] = EnvironmentPolicy(
            name=name, golden_set=merged["golden_set"], required_checks=tuple(merged["required_checks"]),
            allow_warnings=merged["allow_warnings"], approval_required=merged["approval_required"],
            approvers=tuple(merged["approvers"]), acceptance_tolerance=float(merged["acceptance_tolerance"]),
            max_validation_age_days=(float(merged["max_validation_age_days"])
                                     if merged["max_validation_age_days"] is not None else None),
            required_checks_by_method={method: tuple(checks) for method, checks in
                                       merged["required_checks_by_method"].items()},
            approvals_required=merged["approvals_required"],
            min_acceptance_rate=optional_float(merged["min_acceptance_rate"]),
            min_speedup=optional_float(merged["min_speedup"]),
            required_engine_baselines=tuple(merged["required_engine_baselines"]),
        )
    return Policy(built, source, allow_claimed_user, enrollers)


def optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def check_value(source: str, where: str, value: Any, key: str | None = None) -> Any:
    key = key or where
    expected = ENVIRONMENT_KEYS.get(key)
    if expected is None:
        raise UsageError(f"policy {source}: unknown key {where!r} (known: {', '.join(sorted(ENVIRONMENT_KEYS))}, environments, identity, keyring)")
    # bool is an int in Python: a `true` tolerance is an error, not 1.0
    if not isinstance(value, expected) or (expected != bool and isinstance(value, bool)):
        raise UsageError(f"policy {source}: {where} = {value!r} has the wrong type")
    if key in ("required_checks", "approvers") and not all(isinstance(v, str) and v for v in value):
        raise UsageError(f"policy {source}: {where} must be a list of non-empty strings")
    if key == "required_checks_by_method":
        from specreg.registry.store.entities import SpecMethod

        methods = [method.value for method in SpecMethod]
        for method, checks in value.items():
            if method not in methods:
                raise UsageError(f"policy {source}: {where}.{method}: unknown method (known: {', '.join(methods)})")
            if not isinstance(checks, list) or not all(isinstance(v, str) and v for v in checks):
                raise UsageError(f"policy {source}: {where}.{method} must be a list of non-empty strings")
    if key == "required_engine_baselines":
        from specreg.registry.store.engine_baselines import ENGINES

        unknown = [engine for engine in value if engine not in ENGINES]
        if unknown or not all(isinstance(engine, str) for engine in value):
            raise UsageError(f"policy {source}: {where}: unknown engine {(unknown or value)[0]!r} "
                             f"(known: {', '.join(ENGINES)})")
    if key == "approvers":
        try:
            value = [normalize_user(v, what="approver") for v in value]
        except IdentityError as exc:
            raise UsageError(f"policy {source}: {where}: {exc}") from None
    if key == "acceptance_tolerance" and not 0 <= value < 1:
        raise UsageError(f"policy {source}: {where} = {value} must be in [0, 1)")
    if isinstance(value, float) and not math.isfinite(value):
        raise UsageError(f"policy {source}: {where} = {value} must be a finite number")
    if key == "approvals_required" and not 1 <= value <= 100:
        raise UsageError(f"policy {source}: {where} = {value} must be between 1 and 100")
    if key == "min_acceptance_rate" and not 0 <= value <= 1:
        raise UsageError(f"policy {source}: {where} = {value} must be in [0, 1]")
    if key == "min_speedup" and not 0 < value <= 100:
        raise UsageError(f"policy {source}: {where} = {value} must be in (0, 100]")
    if key == "max_validation_age_days" and value <= 0:
        raise UsageError(f"policy {source}: {where} = {value} must be > 0")
    return value

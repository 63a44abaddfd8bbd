"""``specreg.Registry``: the Python API. The CLI is a thin layer over it.

    from specreg import Registry
    registry = Registry("sqlite:///registry.db", user="alice")
    result = registry.register("chat-pair", target="models/target", draft="models/draft",
                               num_speculative_tokens=4)
    registry.get("chat-pair@1")
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass

from specreg import settings
from specreg.core.fingerprint import canonical_json, fingerprint_reference, sha256_hex
from specreg.core.identity import normalize_user
from specreg.core.methods import METHODS, tree_methods
from specreg.core.types import ModelRef
from specreg.errors import PolicyViolation, SpecregError, UsageError
from specreg.registry.store.entities import AuditEvent, PairState, PairVersion, SpecConfig, SpecMethod
from specreg.registry.store.store import Store

NAME_PATTERN = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
NGRAM_DEFAULT_LOOKUP = (1, 4)
# Limits checked here, so that SQLite (which stores anything) and PostgreSQL (which refuses
# what does not fit a column) accept the same inputs: actors are String(255) columns, numbers
# Integer (32-bit on PostgreSQL); notes and reasons are Text on both, capped to stay readable.
MAX_TEXT_LENGTH = 10_000
MAX_SPECULATIVE_TOKENS = 64  # acceptance falls as alpha^k: no engine drafts more per step
MAX_PROMPT_LOOKUP = 64
MAX_BATCH_SIZE = 1_000_000
MAX_DISTRIBUTION_SAMPLES = 1_000_000
MAX_RUNTIME_BATCH = 256


@dataclass(frozen=True)
class RegisterResult:
    version: PairVersion
    created: bool  # False: the same fingerprints + config were already registered


@dataclass(frozen=True)
class PairRef:
    """``NAME``, ``NAME@VERSION`` or ``NAME@ENV`` as the user wrote it."""

    name: str
    version: int | None = None
    environment: str | None = None

    def __str__(self) -> str:
        if self.version is not None:
            return f"{self.name}@{self.version}"
        if self.environment is not None:
            return f"{self.name}@{self.environment}"
        return self.name


def check_name(name: str) -> str:
    if not NAME_PATTERN.fullmatch(name or ""):
        raise UsageError(f"invalid pair name {name!r}: use 1-64 of a-z 0-9 . _ - starting with a letter or digit")
    return name


def check_text(field: str, value: str | None, limit: int = MAX_TEXT_LENGTH) -> str | None:
    """Refuse a free-text value (notes, reason) longer than ``limit`` characters."""
    if value is not None and len(value) > limit:
        raise UsageError(f"{field} is {len(value)} characters long, over the limit of {limit}")
    return value


def check_range(field: str, value: int | None, low: int, high: int) -> int | None:
    """Refuse an integer option outside [low, high] (None passes: not given)."""
    if value is not None and not low <= value <= high:
        raise UsageError(f"invalid {field} {value}: use {low} to {high}")
    return value


# pair_versions.version is an SQL INTEGER: 32 bits on PostgreSQL, so no version is above this
MAX_VERSION = 2**31 - 1


def parse_version(text: str, where: str) -> int | None:
    """A version number as typed ('7' or 'v7', ASCII digits) -> 7; None when ``text`` is not one.
    UsageError naming ``where`` for 0 or a number past MAX_VERSION (no version can have it, and
    the database could not even be asked: SQLite stops at 64 bits, PostgreSQL's INTEGER at 32)."""
    match = re.fullmatch(r"v?([0-9]+)", text)
    if match is None:
        return None
    digits = match.group(1).lstrip("0") or "0"
    if len(digits) > len(str(MAX_VERSION)) or int(digits) > MAX_VERSION:  # int() of 5000 digits raises
        raise UsageError(f"invalid version in {where}: past the largest version number, {MAX_VERSION}")
    if int(digits) < 1:
        raise UsageError(f"invalid version in {where}: versions start at 1")
    return int(digits)


def parse_ref(text: str) -> PairRef:
    """Parse NAME, NAME@VERSION (digits, optionally 'v'-prefixed) or NAME@ENV."""
    name, _, selector = text.partition("@")
    check_name(name)
    if not selector:
        if text.endswith("@"):
            raise UsageError(f"invalid reference {text!r}: nothing after '@'")
        return PairRef(name)
    version = parse_version(selector, repr(text) if len(text) <= 60 else repr(text[:40] + "..."))
    if version is not None:
        return PairRef(name, version=version)
    if re.fullmatch(r"[a-z][a-z0-9_-]{0,31}", selector):
        return PairRef(name, environment=selector)
    raise UsageError(f"invalid reference {text!r}: expected NAME, NAME@VERSION or NAME@ENVIRONMENT")


def parse_method(method: str) -> SpecMethod:
    try:
        return SpecMethod(method)
    except ValueError:
        raise UsageError(f"invalid method {method!r}: use one of {', '.join(m.value for m in SpecMethod)}") from None


MAX_TREE_NODES = 256  # a verification forward over the whole tree: engines use up to ~64


def parse_tree(tree) -> tuple[tuple[int, ...], ...]:
    """A candidate tree as JSON text or a list of paths (``[[0],[1],[0,0]]``: each path the top-i
    choice per depth) -> a tuple of paths. Every path's parent must be in the tree too."""
    import json

    if isinstance(tree, str):
        try:
            tree = json.loads(tree)
        except (ValueError, RecursionError):
            raise UsageError(f"invalid --tree {tree[:80]!r}: not JSON (expected e.g. [[0],[1],[0,0]])") from None
    if not isinstance(tree, (list, tuple)) or not tree:
        raise UsageError("invalid --tree: a non-empty list of paths, e.g. [[0],[1],[0,0]]")
    if len(tree) > MAX_TREE_NODES:
        raise UsageError(f"invalid --tree: {len(tree)} nodes, at most {MAX_TREE_NODES}")
    paths = []
    for path in tree:
        if (not isinstance(path, (list, tuple)) or not path
                or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < MAX_TREE_NODES for i in path)):
            raise UsageError(f"invalid --tree node {path!r}: a non-empty list of top-i indices (integers >= 0)")
        paths.append(tuple(path))
    if len(set(paths)) != len(paths):
        raise UsageError("invalid --tree: a path is listed twice")
    known = set(paths)
    for path in paths:
        if len(path) > 1 and path[:-1] not in known:
            raise UsageError(f"invalid --tree node {list(path)}: its parent {list(path[:-1])} is not in the tree")
    return tuple(sorted(paths, key=lambda p: (len(p), p)))


def build_spec_config(method: str, num_speculative_tokens: int | None, prompt_lookup_min: int | None,
                      prompt_lookup_max: int | None, max_batch_size_for_speculation: int | None,
                      has_draft: bool, tree=None, suffix: dict | None = None) -> SpecConfig:
    """The speculative config a registration binds; UsageError naming the option at fault.
    suffix: vLLM's suffix_decoding_* settings without the prefix (method suffix; unset ones take
    vLLM's defaults, recorded)."""
    spec_method = parse_method(method)
    paths = parse_tree(tree) if tree is not None else None
    if paths is not None:
        if spec_method.descriptor.tree == "never":
            raise UsageError(f"--tree applies to methods {' and '.join(tree_methods())}, not {spec_method.value}")
        depth = max(len(path) for path in paths)
        if num_speculative_tokens is not None and num_speculative_tokens != depth:
            raise UsageError(f"num_speculative_tokens {num_speculative_tokens} differs from the tree's depth {depth}")
        num_speculative_tokens = depth
    if num_speculative_tokens is None:
        raise UsageError(f"num_speculative_tokens is missing: pass -k N (or --tree for {' and '.join(tree_methods())})")
    if num_speculative_tokens < 1:
        raise UsageError(f"invalid num_speculative_tokens {num_speculative_tokens}: must be >= 1")
    check_range("num_speculative_tokens", num_speculative_tokens, 1, MAX_SPECULATIVE_TOKENS)
    if max_batch_size_for_speculation is not None and max_batch_size_for_speculation < 1:
        raise UsageError(f"invalid max_batch_size_for_speculation {max_batch_size_for_speculation}: must be >= 1")
    check_range("max_batch_size_for_speculation", max_batch_size_for_speculation, 1, MAX_BATCH_SIZE)
    check_range("prompt_lookup_min", prompt_lookup_min, 1, MAX_PROMPT_LOOKUP)
    check_range("prompt_lookup_max", prompt_lookup_max, 1, MAX_PROMPT_LOOKUP)
    descriptor = spec_method.descriptor
    if not descriptor.prompt_lookup and (prompt_lookup_min is not None or prompt_lookup_max is not None):
        raise UsageError(f"prompt_lookup_min/max apply only to method "
                         f"{' and '.join(m.name for m in METHODS.values() if m.prompt_lookup)}")
    if descriptor.takes_draft:
        if not has_draft:
            what = f"the {spec_method.value} head directory" if descriptor.has_head else "a draft model"
            raise UsageError(f"method {spec_method.value} needs --draft ({what})")
    elif has_draft:
        source = {"target": "with the layers inside the target", "sequence": "from the prompt"}[descriptor.drafts_with]
        raise UsageError(f"method {spec_method.value} drafts {source}: do not pass --draft")
    suffix = {name: value for name, value in (suffix or {}).items() if value is not None}
    if not descriptor.suffix_settings and suffix:
        raise UsageError(f"{', '.join('suffix_decoding_' + name for name in suffix)}: apply only to method "
                         f"{' and '.join(m.name for m in METHODS.values() if m.suffix_settings)}")
    settings = None
    if descriptor.suffix_settings:
        from specreg.core.suffix import SuffixSettings

        settings = SuffixSettings(**suffix)
        if settings.problem():
            raise UsageError(f"invalid {settings.problem()}")
    if descriptor.prompt_lookup:
        prompt_lookup_min = prompt_lookup_min or NGRAM_DEFAULT_LOOKUP[0]
        prompt_lookup_max = prompt_lookup_max or max(prompt_lookup_min, NGRAM_DEFAULT_LOOKUP[1])
        if prompt_lookup_min < 1 or prompt_lookup_max < prompt_lookup_min:
            raise UsageError(
                f"invalid prompt lookup range {prompt_lookup_min}..{prompt_lookup_max}: need 1 <= min <= max")
    return SpecConfig(spec_method, num_speculative_tokens, prompt_lookup_min, prompt_lookup_max,
                      max_batch_size_for_speculation, tree=paths, suffix=settings)


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
    return description


def export_engine(fmt: str, options: dict | None) -> str | None:
    """The engine whose baseline an export of format ``fmt`` uses: the format's engine
    (k8s-vllm: vllm), prometheus-rules: its rules_engine option when that names one engine,
    argo-analysis: its analysis_engine option."""
    if fmt == "prometheus-rules":
        chosen = (options or {}).get("rules_engine")
        return chosen if chosen in ("vllm", "sglang") else None
    if fmt == "argo-analysis":  # the engine whose metrics the canary's analysis reads
        from specreg.registry.deploy.engines import argo

        return (options or {}).get("analysis_engine") or argo.OPTIONS["analysis_engine"]
    return {"k8s-vllm": "vllm"}.get(fmt, fmt)


class Registry:
    """The registry of speculative-decoding pairs over one database.

    ``db_url``: any SQLAlchemy URL (default ``$SPECREG_DB`` or ``$SPECREG_HOME/registry.db``);
    ``user``: who acts (default ``$SPECREG_USER`` or the OS user); ``mlflow_uri``: the MLflow
    review surface (default ``$MLFLOW_TRACKING_URI`` or the embedded store under
    ``$SPECREG_HOME/mlflow``; ``SPECREG_MLFLOW=off`` turns the mirror off).

    After a validation, approval or promotion, MLflow is brought up to date; when it cannot be
    reached the registry operation still completes and ``warnings`` says MLflow is behind.
    """

    def __init__(self, db_url: str | None = None, user: str | None = None, mlflow_uri: str | None = None):
        self.db_url = db_url or settings.default_db_url()
        self.store = Store(self.db_url)
        self._claimed_user = user
        self._user: str | None = None
        self.mlflow_uri = mlflow_uri
        self.warnings: list[str] = []
        self._review = None

    @property
    def user(self) -> str:
        """Who acts, normalised (specreg.core.identity). SQLite: ``--user``, ``$SPECREG_USER``
        or the OS user (advisory). PostgreSQL: the authenticated role (``session_user``); a
        ``--user``/``$SPECREG_USER`` naming someone else is refused (PolicyViolation) unless the
        policy of record says ``[identity] allow_claimed_user = true``, and is then recorded as claimed
        beside the role in every audit event. Resolved on first use: reading needs no identity."""
        if self._user is None:
            self._user = self.resolve_user()
        return self._user

    def resolve_user(self) -> str:
        import os

        from specreg.core.identity import same_user
        from specreg.errors import PolicyViolation

        role = self.store.authenticated_role()
        if role is None:
            return normalize_user(settings.current_user(self._claimed_user))
        role_name = normalize_user(role, what="database role")
        claimed = self._claimed_user or os.environ.get("SPECREG_USER") or None
        if claimed is not None:
            claimed = normalize_user(claimed)  # a confusable claim is refused, not matched
        if claimed is None or same_user(claimed, role_name):
            return role_name
        policy = self.policy()
        if not policy.allow_claimed_user:
            raise PolicyViolation(
                f"identity: connected to PostgreSQL as role {role_name}, but --user/$SPECREG_USER says "
                f"{claimed!r}; on PostgreSQL the actor is the authenticated role ({policy.source} does not set "
                f"[identity] allow_claimed_user = true)")
        self.store.event_details = {"claimed_user": claimed, "authenticated_role": role_name}
        return claimed

    # --- registration -------------------------------------------------------------------

    def register(self, name: str, *, target: str, draft: str | None = None, num_speculative_tokens: int | None = None,
                 method: str = "draft_model", prompt_lookup_min: int | None = None,
                 prompt_lookup_max: int | None = None, max_batch_size_for_speculation: int | None = None,
                 notes: str | None = None, allow_pickle: bool = False, tree=None,
                 allow_verifier_mismatch: bool = False, suffix: dict | None = None) -> RegisterResult:
        """Fingerprint both models and record version N+1 of ``name`` (or return the version
        that already binds the same fingerprints and config).

        method eagle3 / medusa: ``draft`` is the head directory; mtp: the target's own layers.
        The head must fit the target (hidden size, aux layers, vocabulary and its map, declared
        verifier; see specreg.core.heads); ``tree`` is a Medusa / EAGLE candidate tree; ``suffix``
        vLLM's suffix_decoding_* settings of method suffix, without the prefix."""
        check_name(name)
        check_text("notes", notes)
        config = build_spec_config(method, num_speculative_tokens, prompt_lookup_min, prompt_lookup_max,
                                   max_batch_size_for_speculation, has_draft=draft is not None, tree=tree,
                                   suffix=suffix)
        if config.method.descriptor.drafts_with == "draft model" and draft is not None:
            from specreg.core.heads import head_in_place_of_a_model

            head = head_in_place_of_a_model(draft)
            if head is not None:
                what, method = head
                how = f"register it with --method {method}" if method else "specreg registers EAGLE-3, Medusa and MTP heads"
                raise UsageError(f"{os.path.join(draft, 'config.json')}: {what}, not a draft model (tokenizer files "
                                 f"beside it do not make it one): {how}")
        # Fingerprint before touching the database: a bad model leaves no rows.
        target_ref = fingerprint_reference(target, allow_pickle=allow_pickle)
        draft_ref = fingerprint_reference(draft, allow_pickle=allow_pickle,
                                          require_tokenizer=not config.method.has_head) if draft is not None else None
        if config.method.has_head:
            head = describe_head(config, target_ref, draft_ref, allow_verifier_mismatch=allow_verifier_mismatch)
            config = dataclasses.replace(config, head=head)
            self.warnings.extend(head["fit"].get("warnings", ()))
        elif allow_verifier_mismatch:
            raise UsageError("--allow-verifier-mismatch applies to methods eagle3, medusa and mtp")
        binding = sha256_hex(canonical_json({
            "target": target_ref.fingerprint.to_dict(),
            "draft": draft_ref.fingerprint.to_dict() if draft_ref else None,
            "config": config.to_dict(),
        }))
        from specreg.registry.deploy.lock import list_model_files

        # every file engines may read, not only those the fingerprint covers: an export whose file
        # set differs is refused
        model_files = {role: list(list_model_files(ref.path)) for role, ref in (("target", target_ref),
                                                                                 ("draft", draft_ref)) if ref}
        version, created = self.store.create_version(
            name=name, target=target_ref, draft=draft_ref, config=config, binding_sha256=binding,
            actor=self.user, notes=notes, allow_pickle=allow_pickle, model_files=model_files,
        )
        return RegisterResult(version, created)

    # --- reading ------------------------------------------------------------------------

    def get(self, ref: str | PairRef, *, with_events: bool = False) -> PairVersion:
        """The version named by ``NAME``, ``NAME@VERSION`` (or ``NAME@ENV`` once environments exist)."""
        pair_ref = parse_ref(ref) if isinstance(ref, str) else ref
        if pair_ref.environment is not None:
            return self.resolve_environment(pair_ref, with_events=with_events)
        return self.store.get_version(pair_ref.name, pair_ref.version, with_events=with_events)

    def resolve_environment(self, pair_ref: PairRef, *, with_events: bool = False) -> PairVersion:
        """The version of ``pair_ref.name`` that holds ``pair_ref.environment`` now."""
        from specreg.errors import NotFoundError
        from specreg.registry.governance.queries import holder_of

        version = holder_of(self.store, pair_ref.name, pair_ref.environment)
        if version is None:
            raise NotFoundError(f"{pair_ref}: no version of {pair_ref.name} holds environment {pair_ref.environment}")
        return self.store.get_version(pair_ref.name, version, with_events=with_events)

    def list(self, name: str | None = None) -> list[PairVersion]:
        return self.store.list_versions(check_name(name) if name else None)

    def list_summaries(self) -> list[dict]:
        return self.store.list_summaries()

    def history(self, name: str) -> list[AuditEvent]:
        return self.store.history(check_name(name))

    # --- lifecycle ----------------------------------------------------------------------

    def move(self, ref: str | PairRef, to_state: PairState, *, action: str, reason: str | None = None,
             details: dict | None = None) -> PairVersion:
        """Move a version's lifecycle state; illegal moves raise IllegalTransitionError."""
        check_text("reason", reason)
        version = self.get(ref)
        return self.store.transition(version.name, version.version, to_state, actor=self.user,
                                     action=action, reason=reason, details=details)

    def retire(self, ref: str | PairRef, reason: str | None = None, *, force: bool = False) -> PairVersion:
        """Retire a version; refused (PolicyViolation) while it holds an environment unless ``force``."""
        check_text("reason", reason)
        from specreg.registry.governance import moves

        version = self.get(ref)
        retired = moves.retire(self.store, version.name, version.version, actor=self.user, reason=reason,
                                    force=force)
        self.mirror(version.label)
        return retired

    # --- governance ---------------------------------------------------------------------

    def policy(self, path: str | None = None):
        """The policy of record, which governs every approval, promotion, gate, rollback and
        identity rule (the built-in default until a first one is recorded); with ``path``, the
        policy in that file, to preview only."""
        if path is not None:
            from specreg.registry.governance.policy import load_policy

            return load_policy(path)
        return self.policy_record().policy

    def policy_record(self):
        """The policy of record with who proposed and approved it (policy_record.PolicyRecord)."""
        from specreg.registry.governance.policy_record import policy_of_record

        return policy_of_record(self.store)

    def propose_policy(self, path: str, note: str | None = None) -> dict:
        """Propose the policy in the file ``path`` as the next policy of record (audited); it
        governs once the four-eyes rule of the policy in effect is met (``approve_policy``)."""
        check_text("note", note)
        from specreg.registry.governance.policy_record import propose

        return propose(self.store, path, actor=self.user, note=note)

    def approve_policy(self, version: int, *, key: str | None = None, note: str | None = None) -> dict:
        """Sign this user's approval of proposed policy ``version`` with ``key`` (else
        ``$SPECREG_APPROVAL_KEY``); the approval that meets the rule makes it the policy of record."""
        check_text("note", note)
        from specreg.registry.governance.policy_record import approve

        actor = self.user
        key = key or os.environ.get("SPECREG_APPROVAL_KEY") or None
        if key is None:
            raise UsageError("a policy approval is your signature: pass --key FILE (or set SPECREG_APPROVAL_KEY)")
        return approve(self.store, version, actor=actor, key=key, note=note)

    def policy_history(self) -> list[dict]:
        from specreg.registry.governance.policy_record import history

        return history(self.store)

    def policy_document(self, version: int) -> str:
        from specreg.registry.governance.policy_record import document

        return document(self.store, version)

    def approve(self, ref: str | PairRef, note: str | None = None, *, key: str | None = None,
                environment: str | None = None):
        """Sign and record this user's approval with their private key ``key`` (else
        ``$SPECREG_APPROVAL_KEY``), enrolled to them in the keyring (four-eyes: never the
        registrant; only after a passed validation). ``environment``: the approval holds for
        that environment only (default: any). Returns approvals.Approval."""
        return self.decide(ref, "approved", note, key, environment)

    def reject(self, ref: str | PairRef, note: str | None = None, *, key: str | None = None,
               environment: str | None = None):
        """Sign and record this user's rejection (withdraws the approvals signed before it).
        Returns approvals.Approval."""
        return self.decide(ref, "rejected", note, key, environment)

    def decide(self, ref: str | PairRef, decision: str, note: str | None, key: str | None,
               environment: str | None):
        check_text("note", note)
        from specreg.registry.governance import approvals

        actor = self.user  # who acts comes first: a refused identity is refused before any key is read
        ref = parse_ref(ref) if isinstance(ref, str) else ref  # so does a malformed NAME@VERSION
        key = key or os.environ.get("SPECREG_APPROVAL_KEY") or None
        if key is None:
            raise UsageError(f"{'an approval' if decision == 'approved' else 'a rejection'} is your signature: "
                             f"pass --key FILE (or set "
                             f"SPECREG_APPROVAL_KEY); make one with `specreg keys create`")
        policy = self.policy()
        if environment is not None:
            policy.environment(environment)  # an unknown environment: one line, nothing written
        version = self.get(ref)
        decided = approvals.decide(self.store, policy, version.name, version.version, actor=actor,
                                   decision=decision, note=note, key=key, scope=environment or approvals.ANY_SCOPE)
        self.mirror(version.label)
        return decided

    def enrol_key(self, person: str, public_key: str):
        """Enrol the public key file ``public_key`` as ``person``'s approval key (this user must be
        one of the policy's [keyring] enrollers). Returns signatures.KeyringEntry."""
        from specreg.registry.governance.keyring import enrol

        from pathlib import Path

        from specreg.core.files import read_text_bounded
        from specreg.core.signing import MAX_KEY_BYTES, public_key_pem

        path = Path(public_key).expanduser()
        text = read_text_bounded(path, MAX_KEY_BYTES, "public key")

        return enrol(self.store, self.policy(), person, public_key_pem(text, f"public key {path}"), actor=self.user)

    def keyring(self):
        """(the enrolled keys that count, one line per keyring row that does not)."""
        from specreg.registry.governance.keyring import list_keys

        return list_keys(self.store, self.policy())

    def revoke_key(self, key: str, reason: str):
        """Revoke an enrolled approval key (an enroller of the policy of record only; audited):
        whatever it signed stops counting. Returns signatures.KeyringEntry."""
        check_text("reason", reason)
        if not reason or not reason.strip():
            raise UsageError("keys revoke needs --reason: why the key is revoked, for the audit log")
        from specreg.registry.governance.keyring import revoke

        return revoke(self.store, self.policy(), key, actor=self.user, reason=reason)

    def promote(self, ref: str | PairRef, environment: str, *, reason: str | None = None,
                expected_holder: int | None | str = "current", allow_slower: str | None = None):
        """Make the version hold ``environment`` under the policy of record; returns moves.PointerMove.

        ``expected_holder``: the version number you saw holding the environment (None: none);
        the default reads it now. If another promote moves the pointer before this one commits,
        ConcurrentUpdateError and nothing changes. PolicyViolation names every failed condition.
        ``allow_slower``: why a version below the policy's min_speedup may hold the environment
        anyway; recorded in the audit log as an exception (no other condition is waived)."""
        check_text("reason", reason)
        check_text("allow-slower reason", allow_slower)
        if allow_slower is not None and not allow_slower.strip():
            raise UsageError("--allow-slower needs a reason: who decided it and why, for the audit log")
        from specreg.registry.governance import moves
        from specreg.registry.governance.queries import holder_of

        version = self.get(ref)
        policy = self.policy()
        policy.environment(environment)  # unknown environment: fail before any work
        self.mirror(version.label)  # an approval given in the MLflow UI counts for this promote
        if expected_holder == "current":
            expected_holder = holder_of(self.store, version.name, environment)
        move = moves.promote(self.store, policy, version.name, version.version, environment,
                             actor=self.user, expected_holder=expected_holder, reason=reason,
                             allow_slower=allow_slower)
        self.mirror(version.label)
        return move

    def rollback(self, name: str, environment: str, *, reason: str | None = None):
        """Point ``environment`` of pair ``name`` back at its previous holder; moves.PointerMove."""
        check_text("reason", reason)
        from specreg.registry.governance import moves

        move = moves.rollback(self.store, self.policy(), check_name(name), environment, actor=self.user, reason=reason)
        self.mirror(name)
        return move

    def gate(self, ref: str | PairRef, environment: str, *, policy_path: str | None = None, rerun: bool = False,
             progress=None):
        """Evaluate whether the version may hold ``environment`` now under the policy of record;
        returns decisions.GateResult. ``policy_path``: also judge under that file, as a preview
        (``GateResult.preview``) that decides nothing. ``rerun``: validate again first on the
        policy's golden set (``progress`` as for validate)."""
        from dataclasses import replace

        from specreg.registry.governance import decisions

        policy = self.policy()
        env = policy.environment(environment)
        preview = self.policy(policy_path) if policy_path is not None else None
        if preview is not None:
            preview.environment(environment)
        version = self.get(ref)
        if rerun:
            validate = getattr(self, "validate", None)
            if validate is None:
                raise SpecregError("gate --rerun needs Registry.validate, which this specreg does not have")
            validate(version.label, golden=env.golden_set, acceptance_tolerance=env.acceptance_tolerance,
                     progress=progress)
        result = decisions.gate(self.store, policy, version, environment)
        if preview is not None:
            result = replace(result, preview=decisions.gate(self.store, preview, version, environment).to_dict())
        return result

    def diff(self, ref_a: str | PairRef, ref_b: str | PairRef) -> list[dict]:
        """Models, fingerprints, config and validation figures of two versions side by side."""
        from specreg.registry.governance import compare

        return compare.diff(self.store, self.get(ref_a), self.get(ref_b))

    def environments(self, name: str | None = None) -> list[dict]:
        """Environment pointers: which version holds each environment, and which did before."""
        from specreg.registry.governance import moves

        return moves.environment_pointers(self.store, check_name(name) if name else None)

    def environment_history(self, name: str, environment: str, *, at: str | None = None) -> list:
        """Which version of ``name`` held ``environment`` when, from the audit log: a list of
        registry.governance.environment_history.Tenure, oldest first. ``at`` (ISO 8601, UTC
        without an offset): only the span covering that time (empty: no version held it)."""
        from specreg.registry.governance.environment_history import environment_history, holder_at, parse_time

        when = parse_time(at) if at is not None else None  # a bad time fails before the database
        tenures = environment_history(self.store, check_name(name), environment)
        if when is None:
            return tenures
        found = holder_at(tenures, when)
        return [found] if found is not None and found.version is not None else []

    # --- validation ---------------------------------------------------------------------

    def validation_settings(self, golden: str | None = None, acceptance_tolerance: float | None = None) -> dict:
        """The golden set and acceptance tolerance a validation uses: those given, else those of
        the policy in effect (its validation environment: Policy.validation_environment) ->
        {"golden_set", "acceptance_tolerance", "policy", "environment"} ("environment": None
        when both were given)."""
        if golden is not None and acceptance_tolerance is not None:
            return {"golden_set": golden, "acceptance_tolerance": acceptance_tolerance, "policy": None,
                    "environment": None}
        policy = self.policy()
        env = policy.validation_environment()
        return {"golden_set": golden if golden is not None else env.golden_set,
                "acceptance_tolerance": (acceptance_tolerance if acceptance_tolerance is not None
                                         else env.acceptance_tolerance),
                "policy": policy.source, "environment": env.name}

    def validate(self, ref: str | PairRef, *, golden: str | None = None, device: str = "auto",
                 dtype: str = "float32", checks: str | list[str] | None = None, gpu_memory: str | None = None,
                 acceptance_tolerance: float | None = None, near_tie_tolerance: float | None = None,
                 distribution_samples: int = 4000, seed: int = 0, runtime_batch: int = 8, progress=None,
                 hooks: dict | None = None):
        """Validate a pair version on golden set ``golden`` (a shipped name or a file path) and
        record the run; the version moves to validated or failed. ``golden`` and
        ``acceptance_tolerance`` default to the policy's (validation_settings).

        runtime_batch: golden prompts the runtime decodes at once (each decodes as it would alone;
        the speed figures say the batch size, latency is measured at batch 1 as well).

        checks: "a,b" or a list (default: all of validators.suite.CHECK_NAMES); progress(what, done,
        total, detail) per check, golden prompt and sampled prefix (validators.suite.run_suite);
        hooks: runtime rule overrides (tests only).
        Returns registry.validations.ValidationOutcome (run, version after the move, checks).
        A failing check does not raise: look at ``outcome.passed``. Errors raise SpecregError;
        SIGINT/SIGTERM raise ValidationInterrupted; both leave the run aborted/error and the
        state unchanged.
        """
        from specreg.golden_prompts.loader import load_golden_set
        from specreg.validation import validate_version
        from specreg.validators.suite import ValidationOptions, parse_checks

        settings = self.validation_settings(golden, acceptance_tolerance)
        golden, acceptance_tolerance = settings["golden_set"], settings["acceptance_tolerance"]
        if not 0 <= acceptance_tolerance < 1:
            raise UsageError(f"invalid acceptance tolerance {acceptance_tolerance!r}: use a fraction in [0, 1)")
        if distribution_samples < 1000:
            # below ~1000 draws sparse tokens make the chi-square approximation too loose
            raise UsageError(f"invalid distribution samples {distribution_samples!r}: use at least 1000")
        check_range("distribution samples", distribution_samples, 1000, MAX_DISTRIBUTION_SAMPLES)
        if near_tie_tolerance is not None and not 0 <= near_tie_tolerance < float("inf"):
            raise UsageError(f"invalid near-tie tolerance {near_tie_tolerance!r}: use a finite number >= 0")
        check_range("runtime batch", runtime_batch, 1, MAX_RUNTIME_BATCH)
        selected = parse_checks(checks if isinstance(checks, str) or checks is None else ",".join(checks))
        options = ValidationOptions(device=device, dtype=dtype, checks=selected, gpu_memory=gpu_memory,
                                    acceptance_tolerance=acceptance_tolerance, near_tie_tolerance=near_tie_tolerance,
                                    distribution_samples=distribution_samples, seed=seed,
                                    runtime_batch_size=runtime_batch)
        version = self.get(ref)
        golden_set = load_golden_set(golden)
        outcome = validate_version(self.store, version, golden_set, options, actor=self.user,
                                   progress=progress, hooks=hooks)
        try:
            policy = self.policy()
        except SpecregError:
            policy = None  # a broken policy file is reported by the commands that apply it
        if policy is not None:
            from specreg.registry.governance.floors import low_baseline_warnings

            self.warnings += low_baseline_warnings(outcome.run, policy)
        self.mirror(version.label)
        return outcome

    def validate_engine(self, ref: str | PairRef, *, engine: str, golden: str | None = None,
                        engine_url: str | None = None, reference_url: str | None = None,
                        model_name: str | None = None, concurrency: tuple[int, ...] = (1, 4),
                        parity_tolerance: float = 0.03, near_tie_tolerance: float | None = None,
                        dtype: str = "float32", threads: int | None = None, deadline_s: float = 600.0, progress=None):
        """Validate a version in a serving engine and record its engine baseline (see
        specreg.engine_validation): ``engine`` llamacpp (started here from the pair's files) or
        vllm / sglang at ``engine_url`` (``reference_url``: the same engine without speculation,
        for equivalence). Returns engine_validation.EngineOutcome; the pair's state is unchanged."""
        from specreg.engine_validation import EngineOptions, check_options, validate_in_engine
        from specreg.golden_prompts.loader import load_golden_set

        options = check_options(EngineOptions(
            engine=engine, engine_url=engine_url, reference_url=reference_url, model_name=model_name,
            tiers=tuple(concurrency), parity_tolerance=parity_tolerance, near_tie_tolerance=near_tie_tolerance,
            dtype=dtype, threads=threads, deadline_s=deadline_s))
        version = self.get(ref)
        golden_set = load_golden_set(self.validation_settings(golden, 0.0)["golden_set"])
        return validate_in_engine(self.store, version, golden_set, options, actor=self.user, progress=progress)

    def engine_baselines(self, ref: str | PairRef, engine: str | None = None) -> list:
        """Engine baselines (registry.store.engine_baselines.EngineBaseline) of a version, oldest first."""
        from specreg.registry.store.engine_baselines import EngineBaselineStore

        version = self.get(ref)
        return EngineBaselineStore(self.store).list(version.name, version.version, engine)

    def build_llama_server(self, log=None, progress=None):
        """llama-server built (once, cached) and its sha256 recorded in this registry (audited):
        what `validate --engine llamacpp` checks the binary against before every start. Returns
        its path."""
        from specreg.registry.deploy.engines.llamacpp_build import build_and_record
        from specreg.registry.store.engine_artifacts import ArtifactRecords

        return build_and_record(ArtifactRecords(self.store, self.user), log=log, progress=progress)

    def engine_baseline_standings(self, ref: str | PairRef) -> list:
        """Every engine baseline of a version, oldest first, with whether it counts and why
        (registry.governance.engine_acceptance.Standing)."""
        from specreg.registry.governance.engine_acceptance import standings

        version = self.get(ref)
        return standings(self.store, self.policy(), version.name, version.version)

    def accept_engine_baseline(self, ref: str | PairRef, baseline_id: int, *, key: str | None = None,
                               note: str | None = None) -> dict:
        """Sign and record this user's acceptance of an unaccepted engine baseline (its
        acceptance differs from our runtime's beyond the parity tolerance) with their enrolled
        private key ``key`` (else ``$SPECREG_APPROVAL_KEY``). Returns the baseline's standing as
        a dict. Refused for the registrant, whoever ran that engine validation, a failed baseline."""
        from specreg.registry.governance.engine_acceptance import accept

        check_text("note", note)
        actor = self.user
        ref = parse_ref(ref) if isinstance(ref, str) else ref
        key = key or os.environ.get("SPECREG_APPROVAL_KEY") or None
        if key is None:
            raise UsageError("an acceptance is your signature: pass --key FILE (or set SPECREG_APPROVAL_KEY); "
                             "make one with `specreg keys create`")
        version = self.get(ref)
        return accept(self.store, self.policy(), version.name, version.version, baseline_id, actor=actor, key=key,
                      note=note).to_dict()

    def engine_baseline(self, version: PairVersion, engine: str):
        """The newest baseline of ``engine`` for ``version`` that counts (passed, or accepted by an
        approver; on its current binding and on the audit chain:
        registry/governance/engine_acceptance.py), or None: what exports, alert rules and observe
        for that engine compare with, where one exists."""
        from specreg.registry.governance.engine_acceptance import newest_counted
        from specreg.registry.store.engine_baselines import ENGINES

        if engine not in ENGINES:
            return None
        return newest_counted(self.store, self.policy(), version.name, version.version, engine)

    def baselines_for_engine(self, version: PairVersion, engine: str | None, baselines: dict | None) -> dict | None:
        """``baselines`` (ours) with the acceptance figures of ``engine``'s baseline where one
        exists (registry.store.engine_baselines.with_engine_baseline): what exports, alert rules
        and observe for that engine compare with."""
        from specreg.registry.store.engine_baselines import with_engine_baseline

        found = self.engine_baseline(version, engine) if engine else None
        return with_engine_baseline(baselines, found) if baselines is not None else baselines

    def validation_runs(self, ref: str | PairRef) -> list:
        """Validation runs (registry.entities.ValidationRun) of a version, oldest first; runs
        whose process died are marked aborted first."""
        from specreg.registry.store.validations import ValidationStore

        version = self.get(ref)
        runs = ValidationStore(self.store)
        runs.reap_dead_runs()
        return runs.list_runs(version.name, version.version)

    def baselines(self, ref: str | PairRef) -> dict | None:
        """Acceptance baselines of a version: those of its newest passed validation run, or None."""
        from specreg.registry.store.validations import ValidationStore

        version = self.get(ref)
        return ValidationStore(self.store).baselines(version.name, version.version)

    # --- deployment -------------------------------------------------------------------

    def export(self, ref: str | PairRef, fmt: str, *, out_dir: str | None = None, force: bool = False,
               overwrite: bool = False, template: str | None = None, options: dict | None = None,
               signing_key: str | None = None):
        """Render deployment files for a validated + approved version (``force``: any version,
        marked UNAPPROVED). Approved means the standing decisions say so (the gate's rule, with
        the approvers of ENV for ``NAME@ENV``), not the lifecycle state. Returns [(file name,
        text)], written under ``out_dir`` when given (an existing file only with ``overwrite``).

        Every format but prometheus-rules also gets the pair lock (``specreg.lock.json``, see
        registry.deploy.lock), signed with the ECDSA private key file ``signing_key``; without one
        the lock says ``signed: false`` and a warning says so."""
        from specreg.registry.deploy.engines import format_modules
        from specreg.registry.deploy.exports import (check_exportable, draft_layout, lock_engine, merge_options,
                                                     render_export)
        from specreg.registry.deploy.lock import LOCK_FILE, exported_digests, lock_text, sign_lock
        from specreg.registry.deploy.writing import write_export
        from specreg.registry.governance.approvals import approval_standing
        from specreg.registry.governance.decisions import audit_check
        from specreg.registry.store.validations import ValidationStore

        pair_ref = parse_ref(ref) if isinstance(ref, str) else ref
        version = self.get(pair_ref)
        audited = audit_check(self.store, version)
        if not audited.passed and not force:
            raise PolicyViolation(f"export of {version.label} refused: {audited.reason}")
        env = self.policy().environment(pair_ref.environment) if pair_ref.environment else None
        standing = approval_standing(self.store, self.policy(), version.name, version.version, env)
        approved = standing.passed and audited.passed
        run = ValidationStore(self.store).latest_passed(version.name, version.version)
        baselines = None
        if run is not None and run.baselines is not None:
            # the memory check's estimate sizes the Kubernetes resource requests
            memory = next((c.figures for c in run.checks if c.name == "memory" and c.figures), None)
            baselines = {**run.baselines, "golden_set": run.golden_set, "golden_sha256": run.golden_sha256,
                         "validated_at": run.finished_at.isoformat(timespec="seconds") + "Z",
                         **({"memory": memory} if memory else {})}
        baselines = self.baselines_for_engine(version, export_engine(fmt, options), baselines)
        if not approved and not force:
            raise PolicyViolation(f"{version.label} is not validated and approved ({standing.reason}); export refused "
                                  f"(--force exports it marked UNAPPROVED)")
        exportable = check_exportable(version, baselines, fmt, approved, force)  # refuse before hashing
        engine_layouts = None
        module = format_modules()[fmt]
        if hasattr(module, "write_models"):  # llamacpp: the export makes the files the engine loads (GGUF)
            if out_dir is None:
                raise UsageError(f"export format {fmt} writes the model files the engine loads: give -o DIR")
            from specreg.registry.store.engine_artifacts import ArtifactRecords

            opts = merge_options(options)
            records = ArtifactRecords(self.store, self.user)
            engine_layouts = lambda: module.write_models(version, out_dir, opts, overwrite=overwrite,  # noqa: E731
                                                         records=records)
        lock = None
        if fmt != "prometheus-rules":  # the rules load no model: nothing to lock
            lock = self.pair_lock(version, engine=lock_engine(fmt), baselines=baselines,
                                  signing_key=None, approved=exportable, environment=env,
                                  draft_layout=draft_layout(version, baselines, fmt, exportable, options),
                                  engine_layouts=engine_layouts)
        head = audited.details.get("audit_head") or self.store.audit_head()
        # the engine files go under the lock's signature (serve script, config, each container's
        # args): rendered once to take their digests, then again around the signed lock (the
        # Kubernetes manifest carries it; the files do not depend on the lock's content)
        placeholder = {**lock, "signature": {} if signing_key else None} if lock is not None else None
        files = render_export(version, baselines, fmt, approved=approved, force=force, template_path=template,
                              options=options, lock=placeholder, audit_head=head)
        if lock is not None:
            lock["exported"] = exported_digests(files)
            lock = sign_lock(lock, signing_key) if signing_key else lock
            files = render_export(version, baselines, fmt, approved=approved, force=force, template_path=template,
                                  options=options, lock=lock, audit_head=head)
        if lock is not None:
            files.append((LOCK_FILE, lock_text(lock)))
        if out_dir is not None:
            write_export(files, out_dir, overwrite=overwrite)
        if lock is not None and lock["signature"] is None:
            self.warnings.append(f"{LOCK_FILE} is unsigned (no --signing-key / SPECREG_SIGNING_KEY): "
                                 f"`specreg verify` refuses it unless --allow-unsigned")
        return files

    def pair_lock(self, version: PairVersion, *, engine: dict | None, baselines: dict | None,
                  signing_key: str | None, approved: bool, environment=None,
                  draft_layout: tuple | None = None, engine_layouts=None) -> dict:
        """The lock of ``version`` (registry.deploy.lock.build_lock), signed when ``signing_key`` is given.

        Refused (PolicyViolation) when a model no longer matches its registered fingerprint: a
        lock must bind the files that were validated and approved. ``engine_layouts``: called once
        that check passed, it makes the files the engine loads ({role: (folder, {file: sha256})},
        llamacpp's GGUF files; build_lock binds them as that role's files)."""
        from specreg.errors import PolicyViolation
        from specreg.registry.deploy.lock import build_lock, file_set_changes, sign_lock
        from specreg.registry.governance import approvals
        from specreg.registry.governance.queries import fingerprint_changes

        changes = fingerprint_changes(version) + file_set_changes(version)
        if changes:
            raise PolicyViolation(f"{version.label}: the models changed since registration ({'; '.join(changes)}); "
                                  f"no lock is written for files that were not validated")
        policy = self.policy()
        env = environment or approvals.export_environment(policy)
        # the signed decisions that count now, each with its signature: verify checks them again
        # against the keyring the platform mounts, without the registry
        signed = [{"decision": a.decision, "actor": a.actor, "at": a.created_at.isoformat(timespec="seconds") + "Z",
                   "scope": a.scope, "key_id": a.key_id, "note": a.note, "signature": a.signature}
                  for a in approvals.counted_approvals(self.store, policy, version.name, version.version)]
        approval_policy = {"environment": env.name, "approvals_required": env.approvals_required,
                           "approvers": list(env.approvers), "policy_sha256": policy.sha256}
        lock = build_lock(version, engine=engine, baselines=baselines, approvals=signed,
                          approval_policy=approval_policy,
                          audit_head={"hash": self.store.audit_head()}, approved=approved,
                          exported_by=self.user, draft_layout=draft_layout,
                          engine_layouts=engine_layouts() if engine_layouts else None)
        return sign_lock(lock, signing_key) if signing_key else lock

    def observe(self, ref: str | PairRef, metrics_url: str, *, engine: str = "vllm", interval: float = 30.0,
                model_name: str | None = None, tolerance: float | None = None, policy_path: str | None = None,
                sleep=None, deadline_s: float | None = None) -> dict:
        """Scrape the engine's metrics twice, compare live acceptance with the version's
        baselines and store the observation. ``tolerance`` defaults to the policy's drift
        tolerance of the environment in ``NAME@ENV`` (else 0.1). Returns the observation with
        "verdict" (ok|drift|no-data) and "exit_code" (0|100|1)."""
        import time

        from specreg.registry.deploy.observe import SCRAPE_DEADLINE_S, compare_with_baseline, observe

        pair_ref = parse_ref(ref) if isinstance(ref, str) else ref
        version = self.get(pair_ref)
        if tolerance is None:
            tolerance = (self.policy(policy_path).environment(pair_ref.environment).acceptance_tolerance
                         if pair_ref.environment else 0.1)
        baselines = self.baselines_for_engine(version, engine, self.baselines(version.label))
        live = observe(metrics_url, engine=engine, interval=interval, model_name=model_name,
                       sleep=sleep or time.sleep, deadline_s=SCRAPE_DEADLINE_S if deadline_s is None else deadline_s)
        verdict = compare_with_baseline(live, baselines, tolerance)
        stored = self.store.add_observation(version.name, version.version, environment=pair_ref.environment,
                                            engine=engine, url=metrics_url, figures={**live, **verdict},
                                            verdict=verdict["verdict"])
        return {"pair": version.label, **stored, **verdict, "live": live}

    def observations(self, ref: str | PairRef, limit: int = 5) -> list[dict]:
        version = self.get(ref)
        return self.store.observations(version.name, version.version, limit)

    # --- MLflow review surface ----------------------------------------------------------

    def review(self):
        """The MLflow mirror (registry.review.Review), or None when SPECREG_MLFLOW=off."""
        from specreg.registry.review.replay import Review, mlflow_enabled

        if not mlflow_enabled():
            return None
        import importlib.util

        if importlib.util.find_spec("mlflow") is None:  # a gate or verify install: the registry works on
            note = "MLflow is not installed: no MLflow mirror (SPECREG_MLFLOW=off silences this)"
            if note not in self.warnings:
                self.warnings.append(note)
            return None
        if self._review is None:
            self._review = Review(self.store, self.mlflow_uri, actor=self.user)
        return self._review

    def mirror(self, ref: str | PairRef) -> None:
        """Bring MLflow up to date for a version (or every version of a pair); never fails the
        registry operation that called it: an unreachable MLflow becomes a warning."""
        from specreg.errors import MlflowUnavailable
        from specreg.registry.review.replay import behind_warning

        review = self.review()
        if review is None:
            return
        pair_ref = parse_ref(ref) if isinstance(ref, str) else ref
        versions = [self.get(pair_ref)] if (pair_ref.version or pair_ref.environment) else self.list(pair_ref.name)
        try:
            for version in versions:
                review.sync_version(version)
        except MlflowUnavailable as exc:
            self.warnings.append(behind_warning(review.tracking_uri, exc))
        self.warnings.extend(review.notes)
        review.notes.clear()

    def sync(self, name: str | None = None) -> list[dict]:
        """Replay the registry (one pair or all) into MLflow and read approvals back.
        Idempotent. Raises MlflowUnavailable when MLflow cannot be reached."""
        review = self.review()
        if review is None:
            raise UsageError("MLflow is turned off (SPECREG_MLFLOW=off): nothing to sync")
        review.mlflow.ping()
        done = [review.sync_version(version) for version in self.list(name)]
        self.warnings.extend(review.notes)
        review.notes.clear()
        return done

    # --- database -----------------------------------------------------------------------

    def verify_audit(self) -> tuple[int, str | None]:
        return self.store.verify_audit()

    def not_counted(self) -> list[str]:
        """One line per row that counts for nothing because no audit event covers it (validation
        runs, environment pointers) and per policy activation that does not count."""
        from specreg.registry.governance.policy_record import replay
        from specreg.registry.governance.queries import uncovered_pointers
        from specreg.registry.store.store import verified_chain
        from specreg.registry.store.validations import uncovered_runs

        with self.store.session() as session:
            chain, _ = verified_chain(session)
            return (uncovered_runs(session, chain) + uncovered_pointers(session, chain)
                    + list(replay(session, chain).problems))

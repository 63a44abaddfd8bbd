"""Errors a user can cause. The CLI turns each into one line and an exit code."""


class SpecregError(Exception):
    """Base of every user-facing error; ``exit_code`` is what the CLI exits with."""

    exit_code = 1


class UsageError(SpecregError):
    """Malformed arguments (bad name, bad NAME@VERSION, k < 1 ...)."""

    exit_code = 2


class NotFoundError(SpecregError):
    """An unknown pair, version, environment or file."""


class ModelReferenceError(SpecregError):
    """A model reference that cannot be read: missing path, config, tokenizer, bad weights."""


class ImmutableError(SpecregError):
    """An attempt to change what a registered version binds (models, fingerprints, config)."""


class IllegalTransitionError(SpecregError):
    """A lifecycle move the state machine does not allow."""


class StoreError(SpecregError):
    """The database cannot be reached or used."""


class SchemaOutOfDateError(StoreError):
    """The database schema is older than this specreg; `specreg db upgrade` fixes it."""


class PolicyViolation(SpecregError):
    """A policy, gate or validation says no (CI exit code 100). ``reasons``: (condition, reason)
    pairs when there are several; the CLI prints one a line, each with the command that fixes it."""

    exit_code = 100

    def __init__(self, message: str, reasons: list[tuple[str, str]] | None = None):
        super().__init__(message)
        self.reasons = list(reasons or [])


class GoldenSetError(SpecregError):
    """A golden prompt file that does not parse or validate."""


class RuntimeConfigError(SpecregError):
    """A speculative runtime setup that cannot run (vocab mismatch, k < 1, prompt too long)."""


class RuntimeUnsupportedError(RuntimeConfigError):
    """A pair the engines run but specreg's own runtime does not (e.g. an EAGLE-3 aux layer id
    N): validation's runtime checks could not run, which is an error, never the pair's fail."""


class MlflowUnavailable(SpecregError):
    """MLflow cannot be reached or used; specreg's own database is still complete and
    `specreg sync` brings MLflow up to date later."""


class ConcurrentUpdateError(SpecregError):
    """Someone else changed what this operation was based on (e.g. another promote moved the
    environment pointer first); nothing was changed, run it again to act on the new state."""


class HeadMismatchError(SpecregError):
    """A speculative head (EAGLE-3, Medusa, MTP) that does not fit its target: hidden size,
    layer count and aux layer ids, vocabulary, draft-to-target map or declared verifier. The
    message names the field."""


class EngineRefusal(SpecregError):
    """A serving engine that does not serve this pair as it was registered and validated: a method,
    head variant or setting it lacks or would run otherwise (engines/<engine>.py ``refusal``), said
    in one line with the engine source that decides it. Not a usage error: the pair is what it is,
    so it exits 1, as every export that cannot be written does."""


class ReadBackError(EngineRefusal):
    """An export whose files, read back as its engine reads them, name another method, k, aux
    layers, vocabulary map or target than were registered: nothing is written or signed. The
    message names the file and key, the value read and the registered one."""


class PathTooLongError(UsageError):
    """A path argument the file system cannot hold (ENAMETOOLONG): a component over NAME_MAX
    bytes (255 on Linux and macOS file systems), or the whole path over PATH_MAX."""

    NAME_MAX = 255

    def __init__(self, path):
        import os

        path = os.fsdecode(path)
        longest = max((len(os.fsencode(part)) for part in path.split(os.sep)), default=0)
        shown = path if len(path) <= 80 else path[:40] + "..." + path[-20:]
        super().__init__(f"{shown}: path too long for the file system (longest component {longest} bytes; "
                         f"the limit is usually {self.NAME_MAX})")

    @classmethod
    def refuse(cls, path) -> None:
        """Raise for ``path`` when a component is over NAME_MAX, before anything is created."""
        import os

        if any(len(os.fsencode(part)) > cls.NAME_MAX for part in os.fsdecode(path).split(os.sep)):
            raise cls(path)


class IdentityError(UsageError):
    """A user name that cannot identify one person (control characters, confusable
    spellings), or a claimed identity the database's authentication does not back."""

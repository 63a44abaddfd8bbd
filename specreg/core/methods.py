"""The drafting methods the registry knows, one descriptor each: the facts the CLI, the API, the
validators and the review need about a method without running it. What a method does at run time
lives in its runtime module, runtime/methods/<name>.py (its METHOD: loading and drafter); the
serving engines' translation in registry/deploy/engines/. Adding a method is its runtime module
and one entry here; nothing else branches on a method's name (tests/test_architecture.py).

No heavy imports: the gate and the CLI read this.
"""

from __future__ import annotations

from dataclasses import dataclass

from specreg.errors import UsageError


@dataclass(frozen=True)
class MethodDescriptor:
    name: str  # as registered, exported and named by vLLM's `method`
    summary: str
    # what drafts: "draft model" (a separate causal LM, --draft), "head" (a head directory, --draft,
    # reading the target's hidden states), "target" (layers inside the target: no --draft),
    # "sequence" (no model: the tokens seen so far; no --draft)
    drafts_with: str
    tree: str = "never"  # a candidate tree: "never", "optional" (chain or tree) or "required"
    prompt_lookup: bool = False  # takes prompt_lookup_min / prompt_lookup_max
    depth_limited_by_heads: bool = False  # head i drafts depth i + 1: the depth needs as many heads
    demo_builder: str | None = None  # the builders/ module whose build_demo(...) makes a demo drafter

    @property
    def model_free(self) -> bool:
        """Drafts without any model: no draft law beyond a point mass, no draft forwards."""
        return self.drafts_with == "sequence"

    @property
    def has_head(self) -> bool:
        """Drafts from the target's own hidden states (the --draft directory, if any, is a head)."""
        return self.drafts_with in ("head", "target")

    @property
    def takes_draft(self) -> bool:
        """Registration needs a --draft directory (a model or a head)."""
        return self.drafts_with in ("draft model", "head")

    @property
    def draft_law(self) -> str:
        """What q is when the runtime samples, in words (the distribution check's report)."""
        return {"draft model": "the draft model's distribution",
                "sequence": f"a point mass on the target's top token ({self.name})"}.get(
            self.drafts_with, f"the {self.name} head's distribution")


METHODS: dict[str, MethodDescriptor] = {m.name: m for m in (
    MethodDescriptor("draft_model", "a separate small causal LM", "draft model"),
    MethodDescriptor("ngram", "prompt lookup, no model", "sequence", prompt_lookup=True),
    MethodDescriptor("eagle3", "an EAGLE-3 head on the target's hidden states", "head", tree="optional",
                     demo_builder="demo_heads"),
    MethodDescriptor("medusa", "Medusa heads on the target's last hidden state, verified as a tree", "head",
                     tree="required", depth_limited_by_heads=True, demo_builder="demo_medusa"),
    MethodDescriptor("mtp", "multi-token-prediction layers shipped inside the target", "target",
                     demo_builder="demo_mtp"),
)}


def method_descriptor(name: str) -> MethodDescriptor:
    """The descriptor of a method name; UsageError naming the known ones otherwise."""
    descriptor = METHODS.get(str(getattr(name, "value", name)))
    if descriptor is None:
        raise UsageError(f"unknown method {name!r}: use one of {', '.join(METHODS)}")
    return descriptor


def tree_methods() -> tuple[str, ...]:
    return tuple(name for name, m in METHODS.items() if m.tree != "never")

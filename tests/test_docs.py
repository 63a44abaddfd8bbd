"""Every list of export formats, drafting methods and engines in README.md and docs/ names what
the code's tables hold: the formats of `registry/deploy/engines` (``FORMATS``), the methods of
`specreg/core/methods.py` (``METHODS`` and their descriptors), the engines `validate --engine`
runs (``registry/store/engine_baselines.ENGINES``). A format, method or engine added to a table
fails here until the docs name it; one named in the docs but gone from the code fails too.

Two kinds of check: the lists the docs are known to keep whole (each found by what surrounds it
and held equal to its table), and every other enumeration of three or more such names anywhere
in the pages, which must be one of the sets the code defines (all formats, all methods, the head
methods, ...), never a stale part of one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# the dated log records what was true on its date; everything else describes the code as it is
PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "benchmarks-log.md")]

# How the docs' prose names a method or an engine. A new one needs its prose name here (and then
# every list of them in the docs names it).
METHOD_PROSE = {"draft_model": "draft model", "ngram": "n-gram", "suffix": "suffix", "eagle3": "EAGLE-3",
                "medusa": "Medusa", "mtp": "MTP", "dflash": "DFlash", "dspark": "DSpark", "peagle": "P-EAGLE"}
ENGINE_PROSE = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM", "tgi": "TGI", "llamacpp": "llama.cpp"}


def tables() -> dict[str, tuple[str, ...]]:
    """The code's tables, and the parts of them the docs may list on their own, by what they are."""
    from specreg.core.methods import METHODS
    from specreg.registry.deploy.engines import FORMATS, format_modules
    from specreg.registry.deploy.engines.common import DRAFT_LAW_METHODS
    from specreg.registry.store.engine_baselines import ENGINES

    modules = format_modules()
    return {
        "export formats": tuple(FORMATS),
        "engine modules": tuple(FORMATS.values()),
        # a format named after its engine is that engine's export (k8s-vllm, prometheus-rules and
        # argo-analysis write for an engine that has its own format)
        "serving engines": tuple(fmt for fmt, module in modules.items() if module.ENGINE == fmt),
        "validate --engine engines": ENGINES,
        "engines with Prometheus alerts": tuple(fmt for fmt, module in modules.items()
                                                if module.ENGINE == fmt and hasattr(module, "alert_expressions")),
        "methods": tuple(METHODS),
        "head methods": tuple(name for name, m in METHODS.items() if m.has_head),
        "methods without a head": tuple(name for name, m in METHODS.items() if not m.has_head),
        # the chain drafters whose sampled drafts depend on the draft sampling (validate --draft-sampling)
        "methods with a draft law": tuple(method.value for method in DRAFT_LAW_METHODS),
    }


def names_pattern(names) -> str:
    """One name of ``names`` as a whole word (``vllm`` is not found inside ``k8s-vllm``), in backticks or not."""
    alternatives = "|".join(re.escape(name) for name in sorted(names, key=len, reverse=True))
    return rf"`?(?<![\w.-])(?:{alternatives})(?![\w-])`?"


SEPARATOR = r"(?:,\s*(?:and\s+|or\s+)?|\s+(?:and|or)\s+|\s*/\s*)"


def enumerations(text: str, names) -> list[list[str]]:
    """Each run of three or more of ``names`` joined by commas, "and", "or" or slashes, in ``text``
    (a paragraph's lines joined, so that a list wrapped over lines is one)."""
    one = names_pattern(names)
    found = []
    for paragraph in re.split(r"\n\s*\n", text):
        joined = " ".join(line.strip() for line in paragraph.splitlines())
        for match in re.finditer(rf"{one}(?:{SEPARATOR}{one}){{2,}}", joined):
            found.append([name.strip("`") for name in re.findall(one, match.group(0))])
    return found


def test_the_prose_names_cover_every_method_and_engine():
    known = tables()
    assert sorted(METHOD_PROSE) == sorted(known["methods"]), "give each method its prose name in METHOD_PROSE"
    assert sorted(ENGINE_PROSE) == sorted(known["serving engines"]), "give each engine its prose name in ENGINE_PROSE"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_list_of_formats_methods_and_engines_is_one_the_code_defines(page):
    known = tables()
    text = page.read_text(encoding="utf-8")
    identifiers = {name for names in known.values() for name in names}
    wrong = []
    for found in enumerations(text, identifiers):
        if not any(set(found) == set(names) for names in known.values()):
            wrong.append(f"{', '.join(found)}: not all the " + " / ".join(
                f"{kind} ({', '.join(names)})" for kind, names in known.items() if set(found) & set(names)))
    prose = {**{ENGINE_PROSE.get(n, n): n for n in known["serving engines"]},
             **{METHOD_PROSE.get(n, n): n for n in known["methods"]}}
    for found in enumerations(text, prose):
        ids = {prose[name] for name in found}
        if not any(ids == set(names) for names in known.values()):
            wrong.append(f"{', '.join(found)}: not a list the code defines")
    assert wrong == [], f"{page.name}: a list that leaves out or adds a name: {wrong}"


def section(page: str, start: str, end: str | None = None) -> str:
    text = (ROOT / page).read_text(encoding="utf-8")
    assert start in text, f"{page}: {start!r} not found"
    after = text.split(start, 1)[1]
    return after.split(end, 1)[0] if end else after


def backticked(text: str) -> list[str]:
    return re.findall(r"`([^`\s]+)`", text)


def test_the_whole_lists_name_every_entry_of_their_table():
    known = tables()
    methods, formats, modules = known["methods"], known["export formats"], known["engine modules"]
    # README: the pair kinds, and the reference table's pair-kinds row
    assert sorted(backticked(section("README.md", "- **Pair kinds**:", "\n\n"))) == sorted(methods)
    row = section("README.md", "| [docs/pair-kinds.md](docs/pair-kinds.md) |", "\n")
    assert sorted(backticked(row)) == sorted(methods)
    # commands.md: the formats `export --format` takes
    line = section("docs/commands.md", "--format vllm -o deploy/   #", "\n")
    assert sorted(name.strip() for name in line.split(",")) == sorted(formats)
    # deploy.md: one row per format in the exports table
    rows = section("docs/deploy.md", "| format | engine version |", "\n\n").splitlines()[2:]
    assert sorted(name for row in rows for name in backticked(row.split("|")[1])) == sorted(formats)
    # pair-kinds.md: one row (or more) per method in the table of what each engine serves
    rows = section("docs/pair-kinds.md", "| pair | vLLM", "\n\n").splitlines()[2:]
    assert sorted({row.split("|")[1].split()[0] for row in rows}) == sorted(methods)
    # design.md §1: the engine modules and the drafting methods' modules
    engines_line = section("docs/design.md", "engines/ one module per engine or format (", ";")
    assert sorted(name.strip() for name in " ".join(engines_line.split()).split(",")) == sorted(modules)
    methods_line = section("docs/design.md", "methods/ one module per drafting method (", ":")
    assert sorted(name.strip() for name in " ".join(methods_line.split()).split(",")) == sorted(methods)
    # design.md §4: a bullet for every engine with an export of its own
    bullets = re.findall(r"^- \*\*([^*]+)\*\*", section("docs/design.md", "## §4 Serving engines", "\n## "), re.M)
    assert sorted(bullets) == sorted(ENGINE_PROSE[name] for name in known["serving engines"])

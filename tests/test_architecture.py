"""The house's one-way dependencies, checked by walking every module's imports,
lazy ones inside functions included:

    core <- runtime <- validators <- front door (cli, api, usecases, runtime_validation) -> registry -> core
               runtime <- builders <- front door

and inside the registry: store <- governance <- review, deploy. A new import that breaks a
rule, or closes a cycle between these parts, fails here with the file and line.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# import-name prefix -> folder, as pyproject.toml maps them
FOLDERS = {
    "specreg": ROOT / "specreg",
    "specreg.registry": ROOT / "registry",
    "specreg.validators": ROOT / "validators",
    "specreg.runtime": ROOT / "runtime",
    "specreg.builders": ROOT / "builders",
    "specreg.migrations": ROOT / "migrations",
    "specreg.golden_prompts": ROOT / "golden_prompts",
    "specreg.templates": ROOT / "templates",
}
# A module belongs to the longest of these prefixes; its part may import only the parts listed.
ALLOWED = {
    "specreg.errors": set(),
    "specreg.settings": set(),
    "specreg.core": {"specreg.errors"},
    "specreg.golden_prompts": {"specreg.errors", "specreg.core"},
    "specreg.runtime": {"specreg.errors", "specreg.core"},
    "specreg.validators": {"specreg.errors", "specreg.core", "specreg.runtime", "specreg.golden_prompts"},
    # the demo and real-model builders make models with the runtime's classes; nothing below the
    # front door imports them
    "specreg.builders": {"specreg.errors", "specreg.core", "specreg.runtime"},
    "specreg.registry.store": {"specreg.errors", "specreg.core", "specreg.settings"},
    "specreg.registry.governance": {"specreg.errors", "specreg.core", "specreg.golden_prompts",
                                    "specreg.registry.store"},
    "specreg.registry.review": {"specreg.errors", "specreg.core", "specreg.settings", "specreg.templates",
                                "specreg.registry.store", "specreg.registry.governance"},
    "specreg.registry.deploy": {"specreg.errors", "specreg.core", "specreg.templates",
                                "specreg.registry.store", "specreg.registry.governance"},
    "specreg.registry": {"specreg.registry.store", "specreg.registry.governance", "specreg.registry.review",
                         "specreg.registry.deploy"},
    "specreg.templates": set(),
}
# The schema's migration scripts are the store's own: env.py reads the ORM metadata, the store runs them.
SAME_PART = {"specreg.migrations": "specreg.registry.store"}
# The front door may import anything below it; inside it: cli -> api -> usecases -> runtime_validation,
# engine_validation.
FRONT_DOOR = ("specreg.api", "specreg.usecases", "specreg.runtime_validation", "specreg.engine_validation",
              "specreg.cli", "specreg")
HEAVY = ("torch", "transformers", "mlflow", "sqlalchemy", "alembic", "numpy")


def module_files() -> dict[str, Path]:
    """Import name -> file, for every module of the package."""
    modules = {}
    for prefix, folder in FOLDERS.items():
        for path in folder.rglob("*.py"):
            relative = path.relative_to(folder).with_suffix("")
            parts = [p for p in relative.parts if p != "__init__"]
            name = ".".join([prefix, *parts])
            # a sub-folder mapped to its own prefix (registry/ inside specreg/) is listed there
            if prefix == "specreg" and parts and f"specreg.{parts[0]}" in FOLDERS:
                continue
            modules[name] = path
    return modules


def imports_of(path: Path, module: str) -> list[tuple[str, int]]:
    """Every module that ``path`` imports (absolute names) with its line, lazy imports included."""
    found = []
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                name = f"{base}.{node.module}" if node.module else base
            else:
                name = node.module or ""
            found.append((name, node.lineno))
            # `from specreg.registry import store` imports the sub-module specreg.registry.store
            found += [(f"{name}.{alias.name}", node.lineno) for alias in node.names]
    return found


def part_of(name: str) -> str | None:
    """The part (longest ALLOWED or FRONT_DOOR prefix) a specreg module belongs to."""
    candidates = [p for p in (*ALLOWED, *FRONT_DOOR, *SAME_PART) if name == p or name.startswith(p + ".")]
    part = max(candidates, key=len) if candidates else None
    return SAME_PART.get(part, part)


def violations(modules: dict[str, Path], root: Path = ROOT) -> list[str]:
    problems = []
    for module, path in sorted(modules.items()):
        part = part_of(module)
        if part in FRONT_DOOR:
            continue
        reported = set()  # one problem a line (`from a.b import c` also yields a.b.c)
        for imported, line in imports_of(path, module):
            where = f"{path.relative_to(root)}:{line}"
            if line in reported:
                continue
            if part == "specreg.core" and imported.split(".")[0] in HEAVY:
                problems.append(f"{where}: specreg.core imports {imported} (core stays light)")
                reported.add(line)
            if not imported.startswith("specreg."):
                continue
            target = part_of(imported)
            if target is None or target == part or imported not in modules and target in FRONT_DOOR:
                continue
            if target not in ALLOWED[part]:
                problems.append(f"{where}: {part} imports {imported} ({target} is not below it)")
                reported.add(line)
    return problems


def part_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        part = part_of(module)
        for imported, _ in imports_of(path, module):
            target = part_of(imported) if imported.startswith("specreg.") else None
            if part and target and target != part and not imported == "specreg":
                graph.setdefault(part, set()).add(target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A list of parts forming a cycle, or None (depth-first search with colours)."""
    colour: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        colour[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if colour.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if colour.get(nxt) is None and (cycle := visit(nxt)):
                return cycle
        colour[node] = 2
        stack.pop()
        return None

    for node in sorted(graph):
        if colour.get(node) is None and (cycle := visit(node)):
            return cycle
    return None


def test_every_module_is_in_a_part():
    modules = module_files()
    assert "specreg.registry.store.store" in modules and "specreg.core.types" in modules
    assert [m for m in modules if part_of(m) is None] == []


def test_dependencies_run_one_way():
    assert violations(module_files()) == []


def test_no_import_cycle_between_parts():
    graph = part_graph(module_files())
    assert graph.get("specreg.registry.store"), "the walk found no imports: the checker is broken"
    assert find_cycle(graph) is None


def test_checker_catches_a_reintroduced_cycle(tmp_path):
    """The walk sees a lazy import inside a function: the defect this test was written for
    (registry importing validators) is reported with its file and line, and closes a cycle."""
    fake = tmp_path / "registry" / "store"
    fake.mkdir(parents=True)
    (fake / "entities.py").write_text("def f():\n    from specreg.validators.suite import run_suite\n")
    modules = {**module_files(), "specreg.registry.store.entities": fake / "entities.py"}
    problems = violations({"specreg.registry.store.entities": fake / "entities.py"}, root=tmp_path)
    assert problems == ["registry/store/entities.py:2: specreg.registry.store imports "
                        "specreg.validators.suite (specreg.validators is not below it)"]
    graph = part_graph(modules)
    graph.setdefault("specreg.validators", set()).add("specreg.registry.store")  # validators -> store too
    assert find_cycle(graph) is not None


def test_engine_modules_do_not_import_the_common_export_code():
    """registry/deploy/exports.py imports each engine module (engines.FORMATS), never the other way:
    a new engine plugs in with its module and one table line, and no engine reaches into another's
    export through the common code."""
    modules = module_files()
    engines = {name: path for name, path in modules.items() if name.startswith("specreg.registry.deploy.engines")}
    assert "specreg.registry.deploy.engines.vllm" in engines
    problems = [f"{path.relative_to(ROOT)}:{line}: imports {imported}"
                for name, path in sorted(engines.items()) for imported, line in imports_of(path, name)
                if imported.startswith("specreg.registry.deploy.exports")]
    assert problems == []


@pytest.mark.parametrize("module", ["specreg.core.types", "specreg.core.fingerprint", "specreg.core.methods"])
def test_core_imports_nothing_heavy(module):
    import subprocess
    import sys

    code = (f"import sys, {module}; heavy = [m for m in {HEAVY!r} if m in sys.modules]; "
            "print(','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def sql_imports(modules: dict[str, Path], root: Path = ROOT) -> list[str]:
    """Every import of sqlalchemy or of the store's ORM outside registry/store (lazy ones too):
    the store is the only place that knows SQL (docs/design.md §1)."""
    problems = {}  # one a line: `from a import b` also yields a.b
    for module, path in sorted(modules.items()):
        if part_of(module) == "specreg.registry.store":
            continue
        for imported, line in imports_of(path, module):
            if imported.split(".")[0] == "sqlalchemy" or imported.startswith("specreg.registry.store.orm"):
                problems.setdefault((str(path.relative_to(root)), line), imported)
    return [f"{where}:{line}: imports {imported}" for (where, line), imported in sorted(problems.items())]


def test_only_the_store_knows_sql():
    assert sql_imports(module_files()) == []


def test_sql_check_sees_a_lazy_import(tmp_path):
    fake = tmp_path / "registry" / "governance" / "pointer_moves.py"
    fake.parent.mkdir(parents=True)
    fake.write_text("def f():\n    from sqlalchemy import select\n    from specreg.registry.store import orm\n")
    assert sql_imports({"specreg.registry.governance.pointer_moves": fake}, root=tmp_path) == [
        "registry/governance/pointer_moves.py:2: imports sqlalchemy",
        "registry/governance/pointer_moves.py:3: imports specreg.registry.store.orm"]


MAX_MODULE_LINES = 450
# The modules still past the limit, each to be split by job; one that gets split leaves this list.
LONG_MODULES: dict[str, str] = {}


def module_lengths() -> dict[str, int]:
    """Lines of every Python module outside tests/ (the packages, benchmarks/, scripts/), by path."""
    paths = [path for folder in sorted(ROOT.iterdir()) if folder.is_dir() and folder.name != "tests"
             and not folder.name.startswith(".") and not folder.name.endswith(".egg-info")
             for path in folder.rglob("*.py")]
    return {str(path.relative_to(ROOT)): len(path.read_text(encoding="utf-8").splitlines()) for path in sorted(paths)}


def test_modules_stay_short():
    """A module a reader takes in at once: over 450 lines, split it by what it holds."""
    lengths = module_lengths()
    assert "golden_prompts/loader.py" in lengths and "registry/store/store.py" in lengths
    long = [f"{path}: {n} lines" for path, n in lengths.items() if n > MAX_MODULE_LINES and path not in LONG_MODULES]
    assert long == []
    split = [f"{path}: {lengths.get(path, 0)} lines, take it off LONG_MODULES" for path in LONG_MODULES
             if lengths.get(path, 0) <= MAX_MODULE_LINES]
    assert split == []


def function_lengths(path: Path, inside_class: str | None = None) -> dict[str, int]:
    """Lines of each function of ``path`` (of class ``inside_class`` only, when given), by name."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    if inside_class is not None:
        [tree] = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == inside_class]
    return {f"{path.relative_to(ROOT)}:{node.lineno} {node.name}": node.end_lineno - node.lineno + 1
            for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}


# --- a command's path to the database (docs/design.md §1) -------------------------------------------
# CLI command -> Registry method (api.py: one line naming one use case) -> use case -> the Registry's
# store, or a registry function given it. Commands that open the database without a Registry, and why:
WITHOUT_A_REGISTRY = {
    "specreg/cli/registration.py upgrade": "migrates the schema, which a Registry refuses to open while it is "
                                           "out of date",
    "specreg/cli/deploy.py verify": "runs where an engine starts, on the base install: the lock, the files and "
                                    "(--registry) the registry read-only, through registry/deploy/verify.py",
}


def facade_problems(source: str) -> list[str]:
    """Each public Registry method (properties aside: who acts and the MLflow mirror, resolved once)
    whose body, its docstring aside, is not one call of a function of one use case module
    (imported from specreg.usecases) with the Registry first and no call inside its arguments."""
    tree = ast.parse(source)
    cases = {alias.asname or alias.name for node in tree.body
             if isinstance(node, ast.ImportFrom) and node.module == "specreg.usecases" for alias in node.names}
    [registry] = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Registry"]
    problems = []
    for method in registry.body:
        if (not isinstance(method, ast.FunctionDef) or method.name.startswith("_")
                or any(isinstance(d, ast.Name) and d.id == "property" for d in method.decorator_list)):
            continue
        body = method.body[1:] if ast.get_docstring(method) is not None else method.body
        call = body[0].value if len(body) == 1 and isinstance(body[0], (ast.Return, ast.Expr)) else None
        one_use_case = (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                        and isinstance(call.func.value, ast.Name) and call.func.value.id in cases
                        and bool(call.args) and isinstance(call.args[0], ast.Name) and call.args[0].id == "self")
        if not one_use_case or any(isinstance(node, ast.Call) for argument in (*call.args, *call.keywords)
                                   for node in ast.walk(argument)):
            problems.append(f"{method.lineno} {method.name}")
    return problems


def test_each_api_method_is_one_call_into_one_use_case():
    """api.py is a table from Registry methods to use cases: the work of each is in its use case
    (specreg/usecases/), so a reader looks the line up and goes on to the use case."""
    source = (ROOT / "specreg" / "api.py").read_text(encoding="utf-8")
    assert len(source.splitlines()) <= 250
    methods = function_lengths(ROOT / "specreg" / "api.py", inside_class="Registry")
    assert len(methods) > 40, "the walk found too few Registry methods: the checker is broken"
    assert facade_problems(source) == []


def test_the_facade_check_sees_work_in_a_method():
    source = ("from specreg.usecases import reading\n"
              "class Registry:\n"
              "    @property\n    def user(self):\n        return self._user\n"
              "    def get(self, ref):\n        'One line.'\n        return reading.find_version(self, ref)\n"
              "    def list(self, name):\n        return self.store.list_versions(name)\n"
              "    def diff(self, a, b):\n        a = a.strip()\n        return reading.diff(self, a, b)\n"
              "    def history(self, name):\n        return reading.history(self, check_name(name))\n"
              "    def seen(self, ref):\n        return reading.find_version(ref, self)\n")
    assert facade_problems(source) == ["9 list", "11 diff", "14 history", "16 seen"]


def store_openers(modules: dict[str, Path]) -> set[str]:
    """The modules below the front door that open a database of their own (construct a Store)."""
    def constructs_a_store(path: Path) -> bool:
        return any(isinstance(node, ast.Call) and "Store" in (getattr(node.func, "id", None),
                                                              getattr(node.func, "attr", None))
                   for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))))

    return {name for name, path in modules.items() if part_of(name) not in FRONT_DOOR and constructs_a_store(path)}


def database_paths(files: dict[str, Path], openers: set[str], allowed_cases: tuple[str, ...],
                   root: Path = ROOT, exempt: dict[str, str] = WITHOUT_A_REGISTRY) -> list[str]:
    """Where a module of ``files`` reaches the database other than through a Registry: a use case
    called directly (other than ``allowed_cases``), the Registry's ``store``, a Store of its own, or
    a module that opens one; by top-level function (a command), those ``exempt`` names aside."""
    problems = []
    for module, path in sorted(files.items()):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        spans = [(node.lineno, node.end_lineno, node.name) for node in tree.body
                 if isinstance(node, (ast.FunctionDef, ast.ClassDef))]
        found = [(line, f"imports {imported}") for imported, line in imports_of(path, module)
                 if imported.startswith("specreg.usecases.") and not imported.startswith(allowed_cases)
                 or imported in openers]
        found += [(node.lineno, "reads the Registry's store") for node in ast.walk(tree)
                  if isinstance(node, ast.Attribute) and node.attr == "store"]
        found += [(node.lineno, "uses Store") for node in ast.walk(tree)
                  if isinstance(node, ast.Name) and node.id == "Store"]
        where = path.relative_to(root).as_posix()
        for line, what in sorted(set(found)):
            function = next((name for start, end, name in spans if start <= line <= end), "<module>")
            if f"{where} {function}" not in exempt:
                problems.append(f"{where}:{line} {function}: {what}")
    return problems


def test_a_command_reaches_the_database_only_through_the_registry():
    """The CLI calls Registry methods; it imports no use case (usecases/inputs.py, which checks what
    the user types, aside), never reads the Registry's store and opens no database of its own."""
    modules = module_files()
    openers = store_openers(modules)
    assert "specreg.registry.deploy.verify" in openers, "the walk found no Store: the checker is broken"
    cli_files = {name: path for name, path in modules.items() if name.startswith("specreg.cli")}
    assert database_paths(cli_files, openers, ("specreg.usecases.inputs",)) == []
    unexempted = database_paths(cli_files, openers, ("specreg.usecases.inputs",), exempt={})
    commands = {f"{problem.split(':')[0]} {problem.split(' ')[1].rstrip(':')}" for problem in unexempted}
    assert commands == set(WITHOUT_A_REGISTRY), "an exception no command needs any more: take it out"


def test_a_use_case_opens_no_database_of_its_own():
    """A use case reaches the database through the Registry's store (its methods, the repositories
    of registry/store given it) or a registry function given it, never a Store of its own or a
    module that opens one."""
    modules = module_files()
    cases = {name: path for name, path in modules.items() if name.startswith("specreg.usecases.")}
    assert "specreg.usecases.observe" in cases
    problems = [problem for problem in database_paths(cases, store_openers(modules), ("specreg.usecases.",))
                if not problem.endswith("reads the Registry's store")]
    assert problems == []


def test_the_database_path_check_sees_each_way_round_the_registry(tmp_path):
    fake = tmp_path / "specreg" / "cli" / "example.py"
    fake.parent.mkdir(parents=True)
    fake.write_text("def show(db):\n    from specreg.usecases.reading import history\n"
                    "    from specreg.usecases.inputs import pair_ref\n"
                    "    return open_registry(db).store.history('x')\n"
                    "def upgrade(url):\n    from specreg.registry.deploy.verify import verify_lock\n"
                    "    return Store(url)\n")
    assert database_paths({"specreg.cli.example": fake}, {"specreg.registry.deploy.verify"},
                          ("specreg.usecases.inputs",), root=tmp_path) == [
        "specreg/cli/example.py:2 show: imports specreg.usecases.reading",
        "specreg/cli/example.py:2 show: imports specreg.usecases.reading.history",
        "specreg/cli/example.py:4 show: reads the Registry's store",
        "specreg/cli/example.py:6 upgrade: imports specreg.registry.deploy.verify",
        "specreg/cli/example.py:7 upgrade: uses Store"]


def test_use_cases_sit_below_the_api_and_the_cli():
    """A use case never reaches back up into the facade or the CLI (one way: cli -> api -> usecases)."""
    modules = module_files()
    cases = {name: path for name, path in modules.items() if name.startswith("specreg.usecases.")}
    assert "specreg.usecases.export" in cases
    problems = [f"{path.relative_to(ROOT)}:{line}: imports {imported}"
                for name, path in sorted(cases.items()) for imported, line in imports_of(path, name)
                if imported.startswith(("specreg.api", "specreg.cli"))]
    assert problems == []


def test_engine_modules_are_reached_through_their_interface_only():
    """No hasattr / getattr on the export path: what an engine module has is what
    engines.EngineModule says, so an export reads it without probing."""
    files = [ROOT / "specreg" / "api.py", ROOT / "registry" / "deploy" / "exports.py",
             ROOT / "registry" / "deploy" / "engines" / "__init__.py", *(ROOT / "specreg" / "usecases").glob("*.py")]
    probes = [f"{path.relative_to(ROOT)}:{node.lineno}" for path in files
              for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
              if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("hasattr", "getattr")]
    assert probes == []


def test_only_the_engine_modules_know_an_export_format_by_name():
    """What a format is (whose measured baseline it carries, whether a lock is written, what it
    refuses) its engine module says: the export path names no format, so a new format is its
    module and its line in engines.FORMATS (the CLI's choice of formats is that table)."""
    from specreg.registry.deploy.engines import FORMATS

    files = [ROOT / "registry" / "deploy" / "exports.py", ROOT / "specreg" / "usecases" / "export.py",
             ROOT / "specreg" / "api.py"]
    named = [f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}" for path in files
             for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
             if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in FORMATS]
    assert named == []


def test_every_engine_module_satisfies_the_engine_interface():
    """Each module of engines.FORMATS has every member of engines.EngineModule, each function taking
    the parameters the interface names, each constant of the type it says."""
    import inspect
    import types
    import typing

    from specreg.registry.deploy.engines import EngineModule, format_modules

    hints = typing.get_type_hints(EngineModule)
    functions = {name: [p for p in inspect.signature(member).parameters if p != "self"]
                 for name, member in vars(EngineModule).items()
                 if inspect.isfunction(member) and not name.startswith("_")}
    assert {"refusal", "context", "write_models"} <= set(functions) and "WRITES_MODELS" in hints
    for fmt, module in format_modules().items():
        assert isinstance(module, EngineModule), fmt
        for name, parameters in functions.items():
            assert list(inspect.signature(getattr(module, name)).parameters) == parameters, (fmt, name)
        for name, hint in hints.items():
            value = getattr(module, name)
            allowed = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
            assert isinstance(value, tuple(typing.get_origin(kind) or kind for kind in allowed)), (fmt, name, value)


def test_checks_share_one_shape_and_stay_short():
    """Every check of the suite is a validators.context.Check over one CheckContext, every check of an
    engine validation one over one EngineCheckContext; run_suite and run_engine_checks are loops over
    them, and no function in validators/ runs past 60 lines."""
    from specreg.validators.context import Check
    from specreg.validators.engine import ENGINE_CHECKS
    from specreg.validators.suite import CHECK_NAMES, suite_checks

    checks = suite_checks()
    assert list(checks) == list(CHECK_NAMES)
    assert all(isinstance(check, Check) and check.name == name for name, check in checks.items())
    assert len(ENGINE_CHECKS) == 5 and all(isinstance(check, Check) for check in ENGINE_CHECKS)
    lengths = {name: lines for path in sorted((ROOT / "validators").glob("*.py"))
               for name, lines in function_lengths(path).items()}
    [run_suite] = [lines for name, lines in lengths.items() if name.endswith(" run_suite")]
    [run_engine_checks] = [lines for name, lines in lengths.items() if name.endswith(" run_engine_checks")]
    assert run_engine_checks <= run_suite
    assert {name: lines for name, lines in lengths.items() if lines > 60} == {}


def test_no_import_cycle_between_runtime_modules():
    """Inside the runtime the modules import one way too (the pair, the forward, the tree, the
    methods, the loop), lazy imports included: a cycle means two modules are one idea."""
    modules = {name: path for name, path in module_files().items() if name.startswith("specreg.runtime")}
    graph = {name: {imported for imported, _ in imports_of(path, name) if imported in modules and imported != name}
             for name, path in modules.items()}
    assert "specreg.runtime.tree" in graph["specreg.runtime.methods.medusa"], "the walk found no imports"
    assert find_cycle(graph) is None


# --- method names ---------------------------------------------------------------------------------
# A drafting method is its runtime module (runtime/methods/<name>.py), one descriptor
# (specreg/core/methods.py), per engine its translation (registry/deploy/engines/) and, where it
# has them, its head format's reader (core/heads/<name>_checkpoint.py, torch-free for registration and the
# gate) and its demo builder (the builders/ module its descriptor names). Anywhere else a method's
# name must not decide anything: a fact about a method comes from its descriptor.
def method_names() -> set[str]:
    """Every registered method's name and every head format's (a new method is scanned for as soon
    as its descriptor exists)."""
    from specreg.core.methods import HEAD_FORMATS, METHODS

    return set(METHODS) | set(HEAD_FORMATS)


METHOD_NAMES = method_names()
assert {"draft_model", "ngram", "eagle3", "eagle", "medusa", "mtp"} <= METHOD_NAMES
METHOD_MEMBERS = {name.upper() for name in METHOD_NAMES}  # SpecMethod.<member>


def method_places() -> tuple[str, ...]:
    from specreg.core.methods import HEAD_FORMATS, METHODS

    readers = [f"specreg/core/heads/{name}_checkpoint.py" for name in HEAD_FORMATS]
    return ("runtime/methods/", "registry/deploy/engines/", "specreg/core/methods.py",
            *(reader for reader in readers if (ROOT / reader).is_file()),
            *(f"builders/{m.demo_builder}.py" for m in METHODS.values() if m.demo_builder))


def names_a_method(node: ast.AST) -> bool:
    """A method's name as a literal, SpecMethod.<member>, or a tuple/list/set holding one."""
    if isinstance(node, ast.Constant):
        return node.value in METHOD_NAMES
    if isinstance(node, ast.Attribute):
        return node.attr in METHOD_MEMBERS and isinstance(node.value, ast.Name) and node.value.id == "SpecMethod"
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(names_a_method(element) for element in node.elts)
    return False


def method_branches(source: str, filename: str) -> list[tuple[int, str]]:
    """Where a method's name decides something: a comparison (==, !=, is, in ...) with it in an if,
    elif, while, ternary, assert, comprehension or boolean expression; a match case on it; a dict
    keyed by it (a dispatch table); a subscript or .get() by it."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Compare) and any(names_a_method(n) for n in (node.left, *node.comparators)):
            found.append((node.lineno, "comparison"))
        elif isinstance(node, ast.MatchValue) and names_a_method(node.value):
            found.append((node.lineno, "match case"))
        elif isinstance(node, ast.Dict) and any(key is not None and names_a_method(key) for key in node.keys):
            found.append((node.lineno, "dict keyed by method"))
        elif isinstance(node, ast.Subscript) and names_a_method(node.slice):
            found.append((node.lineno, "lookup by method"))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and node.args and names_a_method(node.args[0])):
            found.append((node.lineno, "lookup by method"))
    return found


def test_no_method_name_is_branched_on_outside_the_method_modules():
    problems = []
    places = method_places()
    for path in sorted(module_files().values()):
        where = path.relative_to(ROOT).as_posix()
        if where.startswith(places):
            continue
        problems += [f"{where}:{line}: {kind} on a method's name (ask its descriptor, specreg/core/methods.py)"
                     for line, kind in method_branches(path.read_text(encoding="utf-8"), where)]
    assert problems == []


@pytest.mark.parametrize("code", [
    "if config.method == 'ngram':\n    pass\n",
    "x = 1 if method in ('eagle3', 'medusa') else 0\n",
    "if config.method is SpecMethod.MTP:\n    pass\n",
    "match method:\n    case 'medusa':\n        pass\n",
    "build = {'draft_model': a, 'ngram': b}[method]\n",
    "reader = READERS.get('eagle')\n",
])
def test_the_method_scan_sees_each_form_of_branch(code):
    assert method_branches(code, "example.py"), code


def test_every_method_has_its_runtime_module():
    """Adding a method is its descriptor and its module: each descriptor has runtime/methods/<name>.py
    whose METHOD carries its name."""
    from specreg.core.methods import METHODS
    from specreg.runtime.methods import drafting_method

    assert [drafting_method(name).name for name in METHODS] == list(METHODS)


def test_the_method_scan_lets_names_be_values():
    """Naming a method as a value (a default, a record, a choice list) decides nothing."""
    code = ("def f(method='draft_model'):\n    return {'method': 'ngram', 'k': 4}\n"
            "CHOICES = ['draft_model', 'ngram']\nm = SpecMethod.MTP\n")
    assert method_branches(code, "example.py") == []


# --- module names ---------------------------------------------------------------------------------
# A module's name says what it holds: two modules (outside __init__.py and tests) share a name only
# where they are one command's layers (docs/design.md §1): its CLI module specreg/cli/NAME.py, which
# defines the command, its use case specreg/usecases/NAME.py, and one registry/<part>/NAME.py that
# the use case imports.
def source_files(root: Path = ROOT) -> list[Path]:
    """Every Python file of the repository outside tests/ (package modules, benchmarks, scripts)."""
    def left_out(folder: str) -> bool:
        return folder.startswith(".") or folder.endswith(".egg-info") or folder in ("tests", "build")

    return sorted(path for path in root.rglob("*.py")
                  if not any(left_out(folder) for folder in path.relative_to(root).parts[:-1]))


def command_modules() -> dict[str, str]:
    """Each top-level command or group of the CLI (its name with - as _) -> the module defining it."""
    from specreg.cli import cli

    return {name.replace("-", "_"): command.callback.__module__ for name, command in cli.commands.items()}


def one_commands_layers(name: str, places: list[str], commands: dict[str, str], root: Path = ROOT) -> bool:
    """Whether ``places`` (paths under ``root``, all called NAME.py) are command NAME's layers."""
    cli_module, use_case = f"specreg/cli/{name}.py", f"specreg/usecases/{name}.py"
    below = [place for place in places if place not in (cli_module, use_case)]
    if name not in commands or use_case not in places or len(below) > 1:
        return False
    if cli_module in places and commands[name] != f"specreg.cli.{name}":
        return False
    imported = {module for module, _ in imports_of(root / use_case, f"specreg.usecases.{name}")}
    return all(len(parts := place.split("/")) == 3 and parts[0] == "registry"
               and f"specreg.registry.{parts[1]}.{name}" in imported for place in below)


def shared_names(files: list[Path], commands: dict[str, str], root: Path = ROOT) -> list[str]:
    """Each file name that two or more modules carry outside one command's layers, with its places."""
    places: dict[str, list[str]] = {}
    for path in files:
        if path.name != "__init__.py":
            places.setdefault(path.name, []).append(path.relative_to(root).as_posix())
    return [f"{name}: {', '.join(where)}" for name, where in sorted(places.items())
            if len(where) > 1 and not one_commands_layers(name.removesuffix(".py"), where, commands, root)]


def test_no_two_modules_share_a_name():
    files = source_files()
    assert {"runtime/methods/eagle3.py", "benchmarks/bench_cli.py", "scripts/argo_schema.py"} <= {
        path.relative_to(ROOT).as_posix() for path in files}, "the walk missed a folder: the checker is broken"
    assert not any(path.relative_to(ROOT).parts[0] == "tests" for path in files)
    assert shared_names(files, command_modules()) == []


def test_the_name_check_allows_only_one_commands_layers(tmp_path):
    """One command's layers pass; the same name in another place, a layer the use case does not
    import, or a name that is no command is reported."""
    def tree(files: dict[str, str]) -> list[Path]:
        for where, text in files.items():
            (tmp_path / where).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / where).write_text(text)
        return [tmp_path / where for where in files]

    commands = {"policy": "specreg.cli.policy"}
    layers = {"specreg/cli/policy.py": "", "registry/governance/policy.py": "",
              "specreg/usecases/policy.py": "def f():\n    from specreg.registry.governance.policy import load\n"}
    assert shared_names(tree(layers), commands, tmp_path) == []
    assert shared_names(tree({**layers, "runtime/policy.py": ""}), commands, tmp_path) == [
        "policy.py: specreg/cli/policy.py, registry/governance/policy.py, specreg/usecases/policy.py, "
        "runtime/policy.py"]
    (tmp_path / "runtime/policy.py").unlink()
    assert shared_names(tree({**layers, "specreg/usecases/policy.py": ""}), commands, tmp_path) == [
        "policy.py: specreg/cli/policy.py, registry/governance/policy.py, specreg/usecases/policy.py"]
    assert shared_names(tree(layers), {"policy": "specreg.cli.governance"}, tmp_path) != []
    assert shared_names(tree({"specreg/core/suffix.py": "", "runtime/methods/suffix.py": ""}), {}, tmp_path) == [
        "suffix.py: specreg/core/suffix.py, runtime/methods/suffix.py"]

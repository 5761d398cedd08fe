"""The import-layer contract: every module imports only from its own layer or layers below.

Layers, bottom to top (a module may import any module of its own layer or of a layer below):

    dialects      coconet.dialects                      the IR: types, ops, layout rules
    core          coconet.core                          program, errors, value layout,
                                                        numerics (tolerances), counter RNG
    toolchain     coconet.toolchain                     the device layer's compilers (NVRTC,
                                                        host C++) and the on-disk kernel cache
    frontend      coconet.frontend                      the Python builder of programs
    passes        coconet.passes                        rewrites, one pass a module
    schedule      coconet.schedule                      the schedule API that drives them:
                                                        named schedules, coco-schedule (a pass
                                                        that expands to the passes below)
    lowering      coconet.lowering                      plans and CUDA C
    runtime       coconet.runtime                       sim oracle, plan runner, backends, launch
    validation    coconet.equivalence                   translation validation (runs the sim)
    api           coconet.compile, coconet.torch,       what users call (and the tuning
                  coconet.tune, coconet (the            package, which compiles and measures)
                  package's __init__, compiled)
    tools         coconet.tools                         console scripts and their rank workers

The runtime reads the lowering through its plan only: of the lowering's modules it imports
just the plan, its kernels' signatures and the plan's traffic (RUNTIME_SEES), and those import
no other lowering module, so the runtime never reaches into the compiler.

Every import counts: module level, inside functions (the lazy imports that used to hide
cycles), under `TYPE_CHECKING`, and dynamic ones with a constant name (`__import__("x.y")`,
`importlib.import_module("x.y")`). Packages map to folders as setuptools maps them (pyproject's
`packages`, through `[tool.setuptools.package-dir]`), so the contract reads what pip installs.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("dialects", ("coconet.dialects",)),
    ("core", ("coconet.core",)),
    ("toolchain", ("coconet.toolchain",)),
    ("frontend", ("coconet.frontend",)),
    ("passes", ("coconet.passes",)),
    ("schedule", ("coconet.schedule",)),
    ("lowering", ("coconet.lowering",)),
    ("runtime", ("coconet.runtime",)),
    ("validation", ("coconet.equivalence",)),
    ("api", ("coconet.compile", "coconet.torch", "coconet.tune", "coconet")),
    ("tools", ("coconet.tools",)),
]


# The lowering modules the runtime may import: the plan, its kernels' signatures, and the
# plan's traffic (a function of the plan alone).
RUNTIME_SEES = frozenset(
    {"coconet.lowering.plan", "coconet.lowering.signature", "coconet.lowering.traffic"}
)


def layer_of(module: str) -> int:
    """The index of the layer holding `module` (the longest matching prefix wins, so
    `coconet.dialects.coco` is in dialects and `coconet` itself in api)."""
    best, best_len = None, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    assert best is not None, f"{module} is in no layer: add it to LAYERS"
    return best


def package_folders() -> dict[str, Path]:
    """Each package pyproject lists, with its folder as setuptools finds it: the folder
    `package-dir` names, else its parent package's folder / its own name (`coconet.tune`)."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapping: dict[str, str] = setuptools["package-dir"]

    def folder(package: str) -> Path:
        if package in mapping:
            return ROOT / mapping[package]
        parent, _, name = package.rpartition(".")
        return folder(parent) / name

    return {package: folder(package) for package in setuptools["packages"]}


def package_modules() -> dict[str, Path]:
    """Every module of the installed package, by dotted name."""
    modules: dict[str, Path] = {}
    for package, folder in package_folders().items():
        for path in sorted(folder.glob("*.py")):
            name = package if path.stem == "__init__" else f"{package}.{path.stem}"
            modules[name] = path
    return modules


def dynamic_import(node: ast.Call) -> list[str]:
    """The modules a call imports by a constant name: `__import__("x.y")` (with `fromlist`,
    also `x.y.NAME` for each name listed, as `from x.y import NAME`) and
    `importlib.import_module("x.y")`; [] for any other call."""
    func = node.func
    called = (
        func.id
        if isinstance(func, ast.Name)
        else f"{func.value.id}.{func.attr}"
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
        else ""
    )
    if called not in ("__import__", "importlib.import_module", "import_module"):
        return []
    if not node.args or not isinstance(node.args[0], ast.Constant):
        return []
    name = node.args[0].value
    if not isinstance(name, str):
        return []
    fromlist = next((k.value for k in node.keywords if k.arg == "fromlist"), None)
    if fromlist is None and called == "__import__" and len(node.args) > 3:
        fromlist = node.args[3]
    names = []
    if isinstance(fromlist, ast.List | ast.Tuple):
        names = [e.value for e in fromlist.elts if isinstance(e, ast.Constant)]
    return [name] + [f"{name}.{n}" for n in names if isinstance(n, str) and n != "_"]


def imported_modules(module: str, path: Path) -> list[tuple[str, int]]:
    """(imported module, line) for every import of `path`, relative ones resolved: import
    statements and dynamic imports by a constant name (`dynamic_import`). `from X import Y`
    counts as importing `X.Y` when that is a module, else `X`."""
    is_package = path.stem == "__init__"
    found: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            found += [(name, node.lineno) for name in dynamic_import(node)]
        elif isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = module.split(".")
                base = parts[: len(parts) - node.level + (1 if is_package else 0)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            found += [(f"{origin}.{alias.name}", node.lineno) for alias in node.names]
    return found


def resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The package module `name` refers to (dropping a trailing attribute), or None."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def upward_imports() -> list[str]:
    modules = package_modules()
    problems = []
    for module, path in modules.items():
        mine = layer_of(module)
        for name, line in imported_modules(module, path):
            target = resolve(name, modules)
            if target is None or target == module:
                continue
            theirs = layer_of(target)
            if theirs > mine:
                where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
                problems.append(
                    f"{where}:{line}: {module} ({LAYERS[mine][0]}) imports {target} "
                    f"({LAYERS[theirs][0]})"
                )
    return problems


def import_graph() -> dict[str, set[str]]:
    modules = package_modules()
    graph: dict[str, set[str]] = {module: set() for module in modules}
    for module, path in modules.items():
        for name, _ in imported_modules(module, path):
            target = resolve(name, modules)
            if target is not None and target != module:
                graph[module].add(target)
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[frozenset[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        cycles.append(frozenset(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return cycles


# Cycles inside one layer that are still to be broken (none now). The test fails on any other
# cycle, and on one of these once it is gone (so the list only shrinks).
KNOWN_CYCLES: set[frozenset[str]] = set()


def test_every_module_is_in_a_layer():
    for module in package_modules():
        layer_of(module)


def test_no_module_imports_a_layer_above_its_own():
    problems = upward_imports()
    assert not problems, "upward imports:\n" + "\n".join(problems)


def test_no_import_cycles_but_the_known_ones():
    cycles = set(import_cycles(import_graph()))
    new = [sorted(c) for c in cycles - KNOWN_CYCLES]
    gone = [sorted(c) for c in KNOWN_CYCLES - cycles]
    assert not new, f"import cycles: {new}"
    assert not gone, f"these cycles are gone; remove them from KNOWN_CYCLES: {gone}"


def boundary_crossings() -> list[str]:
    """Imports of a lowering module by the runtime other than RUNTIME_SEES, and imports of
    another lowering module by those (which would let the runtime reach past them)."""
    modules = package_modules()
    problems = []
    for module, path in modules.items():
        if module.startswith("coconet.runtime."):
            allowed = RUNTIME_SEES
        elif module in RUNTIME_SEES:
            allowed = RUNTIME_SEES - {module}
        else:
            continue
        for name, line in imported_modules(module, path):
            target = resolve(name, modules)
            if (
                target is not None
                and target.startswith("coconet.lowering.")
                and target not in allowed
            ):
                where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
                problems.append(f"{where}:{line}: {module} imports {target}")
    return problems


def test_the_runtime_sees_only_the_plan_of_the_lowering():
    problems = boundary_crossings()
    assert not problems, "past the plan:\n" + "\n".join(problems)


def _add_fake_module(tmp_path, monkeypatch, name: str, text: str) -> None:
    """Make the contract see one more module, `name`, whose source is `text`."""
    modules = package_modules()
    fake = tmp_path / "fake.py"
    fake.write_text(text)
    monkeypatch.setattr(
        __import__(__name__, fromlist=["_"]), "package_modules", lambda: {**modules, name: fake}
    )


def test_the_boundary_check_sees_a_crossing(tmp_path, monkeypatch):
    """The checker itself: a runtime module importing the plan builder is reported."""
    text = "def f():\n    from coconet.lowering.lower_to_plan import lower\n"
    _add_fake_module(tmp_path, monkeypatch, "coconet.runtime.fake", text)
    (problem,) = boundary_crossings()
    assert "coconet.runtime.fake imports coconet.lowering.lower_to_plan" in problem


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_cycles(graph) == [frozenset({"a", "b", "c"})]


def test_the_contract_sees_an_upward_import(tmp_path, monkeypatch):
    """The checker itself: a lowering module importing the runtime is reported."""
    text = "def f():\n    from coconet.runtime.sim import run\n"
    _add_fake_module(tmp_path, monkeypatch, "coconet.lowering.fake", text)
    (problem,) = upward_imports()
    assert "coconet.lowering.fake (lowering) imports coconet.runtime.sim (runtime)" in problem


def test_every_package_folder_is_a_listed_package():
    """A folder with an `__init__.py` under a package's folder is a package pyproject lists:
    one left out would be missing from the wheel and from this contract."""
    folders = package_folders()
    listed = {folder.resolve() for folder in folders.values()}
    missing = [
        init.parent.relative_to(ROOT)
        for folder in folders.values()
        for init in folder.rglob("__init__.py")
        if init.parent.resolve() not in listed and "__pycache__" not in init.parts
    ]
    assert not missing, f"add these packages to pyproject's [tool.setuptools] packages: {missing}"


def with_fake_modules(monkeypatch, fakes: dict[str, Path]) -> None:
    modules = package_modules()
    monkeypatch.setattr(
        __import__(__name__, fromlist=["_"]), "package_modules", lambda: {**modules, **fakes}
    )


def test_the_contract_sees_a_dynamic_upward_import(tmp_path, monkeypatch):
    """`__import__` and `importlib.import_module` with a constant name are imports too."""
    fake = tmp_path / "fake.py"
    fake.write_text(
        "import importlib\n"
        "def f():\n"
        '    return __import__("coconet.runtime", fromlist=["sim"]).sim\n'
        "def g():\n"
        '    return importlib.import_module("coconet.schedule.api")\n'
    )
    with_fake_modules(monkeypatch, {"coconet.passes.fake": fake})
    found = {problem.partition(": ")[2] for problem in upward_imports()}
    assert found == {
        "coconet.passes.fake (passes) imports coconet.runtime (runtime)",
        "coconet.passes.fake (passes) imports coconet.runtime.sim (runtime)",  # the fromlist
        "coconet.passes.fake (passes) imports coconet.schedule.api (schedule)",
    }


def test_the_contract_sees_a_dynamic_cycle(tmp_path, monkeypatch):
    """Two modules of one layer, one importing the other dynamically: a cycle."""
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("from coconet.passes import fake_b\n")
    b.write_text('def f():\n    return __import__("coconet.passes.fake_a", fromlist=["_"])\n')
    with_fake_modules(monkeypatch, {"coconet.passes.fake_a": a, "coconet.passes.fake_b": b})
    assert frozenset({"coconet.passes.fake_a", "coconet.passes.fake_b"}) in import_cycles(
        import_graph()
    )

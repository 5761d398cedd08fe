"""The import-layer contract: every module imports only from its own layer or layers below.

Layers, bottom to top (a module may import any module of its own layer or of a layer below):

    dialects      coconet.dialects                      the IR: types, ops, layout rules
    core          coconet.core                          program, errors, value layout,
                                                        numerics (tolerances), counter RNG
    toolchain     coconet.toolchain                     the device layer's compilers (NVRTC,
                                                        host C++) and the on-disk kernel cache
    frontend      coconet.frontend                      the Python builder of programs
    passes        coconet.passes, coconet.schedule      rewrites and the schedule API that
                                                        drives them (coco-schedule is a pass)
    lowering      coconet.lowering                      plans and CUDA C
    runtime       coconet.runtime                       sim oracle, plan runner, backends, launch
    validation    coconet.equivalence                   translation validation (runs the sim)
    api           coconet.compile, coconet.torch,       what users call (and the autotuner,
                  coconet.autotune, cost_model, ...     which compiles and measures)
                  coconet (the package's __init__)
    tools         coconet.tools                         console scripts and their rank workers

The runtime reads the lowering through its plan only: of the lowering's modules it imports
just the plan and its kernels' signatures (RUNTIME_SEES), and those two import no other
lowering module, so the runtime never reaches into the compiler.

Every import counts: module level, inside functions (the lazy imports that used to hide
cycles), and under `TYPE_CHECKING`. Folders map to subpackages through pyproject's
`[tool.setuptools.package-dir]`, so the contract reads the same mapping pip uses.
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
    ("passes", ("coconet.passes", "coconet.schedule")),
    ("lowering", ("coconet.lowering",)),
    ("runtime", ("coconet.runtime",)),
    ("validation", ("coconet.equivalence",)),
    ("api", ("coconet.compile", "coconet.torch", "coconet")),
    ("tools", ("coconet.tools",)),
]


# The lowering modules the runtime may import: the plan and its kernels' signatures.
RUNTIME_SEES = frozenset({"coconet.lowering.plan", "coconet.lowering.signature"})


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


def package_modules() -> dict[str, Path]:
    """Every module of the installed package, by dotted name, from pyproject's mapping."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    mapping = config["tool"]["setuptools"]["package-dir"]
    modules: dict[str, Path] = {}
    for package, folder in mapping.items():
        for path in sorted((ROOT / folder).glob("*.py")):
            name = package if path.stem == "__init__" else f"{package}.{path.stem}"
            modules[name] = path
    return modules


def imported_modules(module: str, path: Path) -> list[tuple[str, int]]:
    """(imported module, line) for every import statement of `path`, relative ones resolved.
    `from X import Y` counts as importing `X.Y` when that is a module, else `X`."""
    is_package = path.stem == "__init__"
    found: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
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

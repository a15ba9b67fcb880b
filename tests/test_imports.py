"""Imports go one way, read from the source (no module is imported here).

Every `import` under plscale/, at module level or inside a function, is an edge from the module
that holds it to each module the statement names: `import a.b` names a.b; `from a import b`
names a, and a.b too when b is a submodule; relative imports are resolved against the package.

    cli -> run (host) -> lab (both sides) -> dsconfig, predict, errors, files
    rank, strategies, jaxlab (ranks) -> lab, rank, ...; never run, never cli
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "plscale"
RANK_SIDE = ("plscale.rank", "plscale.strategies", "plscale.dsconfig", "plscale.jaxlab", "plscale.lab")
HOST_ONLY = ("plscale.run", "plscale.cli", "plscale.slurm")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def _is_package(name: str) -> bool:
    return MODULES.get(name, Path()).name == "__init__.py"


def imports(name: str) -> list[tuple[str, str, int]]:
    """(module named, where, line) for every import statement in module `name`; where is "module"
    (run on import), "function" (run when called) or "typing" (under `if TYPE_CHECKING:`, never run)."""
    path = MODULES[name]
    tree = ast.parse(path.read_text(), str(path))
    where: dict[int, str] = {}

    def mark(nodes, kind: str) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                mark(node.body, "typing")
                mark(node.orelse, kind)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                for child in ast.walk(node):
                    where.setdefault(id(child), "function")
            elif isinstance(node, ast.ClassDef):
                mark(node.body, kind)
            else:
                where[id(node)] = kind
                mark(ast.iter_child_nodes(node), kind)

    mark(tree.body, "module")
    found = []
    for node in ast.walk(tree):
        kind = where.get(id(node), "module")
        if isinstance(node, ast.Import):
            found += [(alias.name, kind, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = name if _is_package(name) else name.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = ".".join(filter(None, (package, node.module)))
            else:
                base = node.module
            found.append((base, kind, node.lineno))
            found += [(f"{base}.{alias.name}", kind, node.lineno) for alias in node.names
                      if f"{base}.{alias.name}" in MODULES]
    return found


def graph() -> dict[str, set[str]]:
    """module -> the plscale modules it imports when run (not those under `if TYPE_CHECKING:`)."""
    return {name: {target for target, kind, _ in imports(name) if target in MODULES and target != name
                   and kind != "typing"} for name in MODULES}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def _under(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def test_the_reader_finds_what_it_must():
    """The analysis itself: relative, submodule and function-level imports are seen."""
    assert {"plscale.lab.labs", "plscale.lab.resolve"} <= graph()["plscale.lab.entry"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    kinds = {t: kind for t, kind, _ in imports("plscale.cli.report")}
    assert kinds["plscale.run.compare"] == "function"  # imported inside the command
    assert {t: kind for t, kind, _ in imports("plscale.lab.entry")}["plscale.rank.metrics"] == "typing"
    assert ("plscale.dsconfig", "module") in {(t, k) for t, k, _ in imports("plscale.dsconfig.check")}
    assert ("plscale.dsconfig.valid", "module") in {(t, k) for t, k, _ in imports("plscale.dsconfig.check")}


def test_no_import_cycle():
    cycle = find_cycle(graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_rank_side_never_imports_the_host_side():
    bad = [f"{name}:{line} imports {target}" for name in MODULES if _under(name, RANK_SIDE)
           for target, _, line in imports(name) if _under(target, HOST_ONLY)]
    assert not bad, "\n".join(bad)


def test_strategies_sit_on_the_rank_runtime_not_under_it():
    """A strategy may use what runs a rank (distributed init, tallies, data); what runs a rank
    never reaches into a strategy, so plscale/rank stays free of anything lab-specific."""
    bad = [f"{name}:{line} imports {target}" for name in MODULES if _under(name, ("plscale.rank",))
           for target, _, line in imports(name) if _under(target, ("plscale.strategies",))]
    assert not bad, "\n".join(bad)


def test_the_host_side_imports_no_rank_code_and_no_torch_at_module_level():
    bad = []
    for name in MODULES:
        if not _under(name, ("plscale.run", "plscale.slurm")):
            continue
        for target, kind, line in imports(name):
            if _under(target, ("plscale.rank", "plscale.strategies", "plscale.jaxlab")):
                bad.append(f"{name}:{line} imports {target}")
            elif kind == "module" and _under(target, ("torch", "deepspeed", "jax")):
                bad.append(f"{name}:{line} imports {target} at module level")
    assert not bad, "\n".join(bad)


def test_the_shared_lab_package_imports_no_backend():
    """plscale.lab runs on the host and in every rank: at module level no torch, jax or deepspeed,
    nothing of the host (run, cli) and nothing of the ranks' own code."""
    bad = [f"{name}:{line} imports {target}" for name in MODULES if _under(name, ("plscale.lab",))
           for target, kind, line in imports(name) if kind == "module"
           and _under(target, ("torch", "deepspeed", "jax", "plscale.run", "plscale.cli", "plscale.rank",
                               "plscale.strategies", "plscale.jaxlab"))]
    assert not bad, "\n".join(bad)


def test_dsconfig_sits_below_the_lab_package():
    """plscale.lab.resolve builds and checks the DeepSpeed config, so plscale.dsconfig never imports
    plscale.lab (nor plscale.run): the two packages stay out of each other's import cycle."""
    bad = [f"{name}:{line} imports {target}" for name in MODULES if _under(name, ("plscale.dsconfig",))
           for target, _, line in imports(name) if _under(target, ("plscale.lab", "plscale.run"))]
    assert not bad, "\n".join(bad)


def test_every_name_imported_from_plscale_exists():
    """A moved or renamed function fails here, before any lab runs: every `from plscale.X import
    name` in plscale/, labs/ and benchmarks/ names a module or an attribute that exists."""
    import importlib

    missing = []
    for folder in ("plscale", "labs", "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                        and node.module.split(".")[0] == "plscale"):
                    continue
                try:
                    module = importlib.import_module(node.module)
                except ModuleNotFoundError as exc:
                    if exc.name and not exc.name.startswith("plscale"):
                        continue  # an optional extra (jax, megatron) that is not installed here
                    missing.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.module}")
                    continue
                for alias in node.names:
                    if not hasattr(module, alias.name) and \
                            importlib.util.find_spec(f"{node.module}.{alias.name}") is None:
                        missing.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.module}.{alias.name}")
    assert not missing, "imported but nowhere defined:\n" + "\n".join(missing)

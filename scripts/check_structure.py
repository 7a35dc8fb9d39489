"""Structure checks for the zeromismatch package: import cycles, over-long modules, function-level imports.

    python scripts/check_structure.py                  # checks src/zeromismatch; exit 1 on any finding
    python scripts/check_structure.py --max-lines 500 --package src/zeromismatch

Rules (tests/test_structure.py runs the same functions):
- No import cycle between modules. The graph has an edge A -> B for every `import` / `from ... import` in A
  that names B, at module level or inside a function (a function-level import still makes A depend on B; it
  only hides the cycle until the function runs). `from pkg import name` points at pkg.name when that is a
  module, else at pkg (its __init__). Executing the parent packages' __init__ files is not counted as an
  edge: a package __init__ that re-exports its submodules would otherwise form a cycle with each of them.
  Imports under `if TYPE_CHECKING:` never run and are left out; so are importlib calls (strings).
- No import cycle between packages: the same graph folded onto zeromismatch's subpackages (ops, kernels,
  models, ...), so two packages that each import the other through different modules are found too.
- No module over `--max-lines` lines (500).
- No function-level imports, except of an optional dependency (OPTIONAL_DEPENDENCIES) or of a project
  module that needs one at import time (it, or a project module it imports at module level, imports an
  optional dependency at module level): CPU machines have no triton, and a lazy import is how a module
  that works without it reaches the code that needs it.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

MAX_LINES = 500
# wandb: imported only by a run that logs to W&B (its import is slow, and a failed import must leave the JSONL)
OPTIONAL_DEPENDENCIES = frozenset({"triton", "transformers", "vllm", "ray", "wandb"})
DEFAULT_PACKAGE = Path(__file__).resolve().parents[1] / "src" / "zeromismatch"


@dataclass(frozen=True)
class Import:
    """One imported name: `module` (the importer) depends on `target` (absolute dotted name)."""

    module: str
    target: str
    path: Path
    line: int
    function: str | None  # the enclosing function's qualified name; None at module level
    text: str  # the import statement's source
    guarded: bool = False  # inside `try:` with an `except ImportError` (the module works without it)

    @property
    def where(self) -> str:
        scope = f" (function-level, in {self.function})" if self.function else ""
        return f"{_shown(self.path)}:{self.line}: {self.text}{scope}"


def _shown(path: Path) -> Path:
    """A path as a reader types it: relative to the working directory when under it."""
    try:
        return path.relative_to(Path.cwd())
    except ValueError:
        return path


# ------------------------------------------------------------------------------------------ parsing


def discover_modules(package_dir: Path) -> dict[str, Path]:
    """{dotted module name: file} for every .py file under package_dir (a package's __init__.py is the
    package's own name)."""
    package_dir = Path(package_dir)
    root = package_dir.parent
    modules = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    names = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(n is None or (isinstance(n, ast.Name) and n.id in ("ImportError", "ModuleNotFoundError", "Exception"))
               for n in names)


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str | None:
    """The absolute dotted name `from <node.module>` refers to; None if it climbs above the top package."""
    if node.level == 0:
        return node.module
    package = module.split(".") if is_package else module.split(".")[:-1]
    if node.level - 1 > len(package) - 1:
        return None
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _internal(name: str, modules: Mapping[str, Path]) -> str | None:
    """The project module a dotted name lives in (its longest prefix that is a module), or None."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        candidate = ".".join(parts[:n])
        if candidate in modules:
            return candidate
    return None


def imports_of(module: str, path: Path, modules: Mapping[str, Path]) -> list[Import]:
    """Every name `module` imports, with its line and enclosing function."""
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[Import] = []

    def add(target: str, node: ast.stmt, function: str | None, guarded: bool) -> None:
        found.append(Import(module, target, path, node.lineno, function, ast.unparse(node), guarded))

    def visit(node: ast.AST, scope: list[str], function: str | None, guarded: bool) -> None:
        for child in ast.iter_child_nodes(node):
            visit_stmt(child, scope, function, guarded)

    def visit_stmt(child: ast.AST, scope: list[str], function: str | None, guarded: bool) -> None:
        if isinstance(child, ast.Import):
            for alias in child.names:
                add(alias.name, child, function, guarded)
        elif isinstance(child, ast.ImportFrom):
            base = _resolve(module, is_package, child)
            if base is None:
                add("." * child.level + (child.module or ""), child, function, guarded)
                return
            for alias in child.names:
                sub = f"{base}.{alias.name}"
                add(sub if alias.name != "*" and sub in modules else base, child, function, guarded)
        elif isinstance(child, ast.If) and _is_type_checking(child.test):
            for stmt in child.orelse:  # the body never runs
                visit_stmt(stmt, scope, function, guarded)
        elif isinstance(child, ast.Try) and any(_catches_import_error(h) for h in child.handlers):
            for stmt in child.body:
                visit_stmt(stmt, scope, function, True)
            for part in (child.handlers, child.orelse, child.finalbody):
                for stmt in part:
                    visit_stmt(stmt, scope, function, guarded)
        elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            inner = scope + [child.name]
            visit(child, inner, ".".join(inner), guarded)
        elif isinstance(child, ast.ClassDef):
            visit(child, scope + [child.name], function, guarded)  # a class body runs at import time
        else:
            visit(child, scope, function, guarded)

    visit(tree, [], None, False)
    return found


def collect_imports(package_dir: Path) -> tuple[dict[str, Path], list[Import]]:
    modules = discover_modules(package_dir)
    imports = [imp for name, path in modules.items() for imp in imports_of(name, path, modules)]
    return modules, imports


def import_graph(modules: Mapping[str, Path], imports: Iterable[Import]) -> dict[str, dict[str, list[Import]]]:
    """{importer: {imported project module: [the imports that make the edge]}}, every module a key."""
    graph: dict[str, dict[str, list[Import]]] = {m: {} for m in modules}
    for imp in imports:
        target = _internal(imp.target, modules)
        if target is not None:
            graph[imp.module].setdefault(target, []).append(imp)
    return graph


# ------------------------------------------------------------------------------------------- cycles


def strongly_connected(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components (iterative), each sorted; only those that hold a cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            advanced = False
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = counter
                    counter += 1
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph[succ]))))
                    advanced = True
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph[node]:
                    components.append(sorted(component))
    return sorted(components, key=lambda c: (-len(c), c))


def shortest_cycle(graph: Mapping[str, Iterable[str]], start: str, within: set[str]) -> list[str] | None:
    """The shortest cycle start -> ... -> start inside `within` (breadth-first), as its list of nodes."""
    parent: dict[str, str] = {}
    queue = deque()
    for succ in sorted(graph[start]):
        if succ == start:
            return [start]
        if succ in within and succ not in parent:
            parent[succ] = start
            queue.append(succ)
    while queue:
        node = queue.popleft()
        for succ in sorted(graph[node]):
            if succ == start:
                path = [node]
                while path[-1] != start:
                    path.append(parent[path[-1]])
                return path[::-1]
            if succ in within and succ not in parent:
                parent[succ] = node
                queue.append(succ)
    return None


def find_cycles(graph: Mapping[str, Iterable[str]]) -> list[tuple[list[str], list[list[str]]]]:
    """[(component, its cycles)]: every group of modules that import each other, and the shortest cycle
    through each member (duplicates removed, each written from its smallest module name)."""
    out = []
    for component in strongly_connected(graph):
        members = set(component)
        cycles: list[list[str]] = []
        for node in component:
            cycle = shortest_cycle(graph, node, members)
            if cycle is None:
                continue
            i = cycle.index(min(cycle))
            cycle = cycle[i:] + cycle[:i]
            if cycle not in cycles:
                cycles.append(cycle)
        out.append((component, sorted(cycles, key=lambda c: (len(c), c))))
    return out


def describe_cycles(graph: Mapping[str, Mapping[str, list[Import]]], cycles, noun: str = "modules") -> str:
    """Each cycle as `a -> b -> a`, then the import statements behind each of its edges."""
    lines = []
    for component, component_cycles in cycles:
        lines.append(f"import cycle among {len(component)} {noun}: {', '.join(component)}")
        for cycle in component_cycles:
            lines.append("  " + " -> ".join(cycle + [cycle[0]]))
            for a, b in zip(cycle, cycle[1:] + cycle[:1]):
                for where in dict.fromkeys(imp.where for imp in graph[a][b]):  # one line per statement
                    lines.append(f"      {where}")
    return "\n".join(lines)


def package_graph(graph: Mapping[str, Mapping[str, list[Import]]],
                  depth: int = 2) -> dict[str, dict[str, list[Import]]]:
    """The module graph folded onto packages: zeromismatch.ops.gdn.reference counts as zeromismatch.ops
    (depth 2). An edge joins two different packages; its imports are the module edges behind it."""
    def unit(name: str) -> str:
        return ".".join(name.split(".")[:depth])

    folded: dict[str, dict[str, list[Import]]] = {unit(m): {} for m in graph}
    for a, targets in graph.items():
        for b, imps in targets.items():
            if unit(a) != unit(b):
                folded[unit(a)].setdefault(unit(b), []).extend(imps)
    return folded


# ------------------------------------------------------------------------------------ long modules


def long_modules(modules: Mapping[str, Path], max_lines: int = MAX_LINES) -> list[tuple[Path, int]]:
    """[(file, line count)] of the modules over max_lines, longest first."""
    counts = [(path, len(path.read_text(encoding="utf-8").splitlines())) for path in modules.values()]
    return sorted(((p, n) for p, n in counts if n > max_lines), key=lambda x: (-x[1], str(x[0])))


def describe_long_modules(found: list[tuple[Path, int]], max_lines: int = MAX_LINES) -> str:
    return "\n".join(f"{_shown(path)}: {n} lines (limit {max_lines})" for path, n in found)


# --------------------------------------------------------------------------- function-level imports


def needs_optional(modules: Mapping[str, Path], imports: Iterable[Import],
                   optional: Iterable[str] = OPTIONAL_DEPENDENCIES) -> set[str]:
    """Project modules whose import pulls in an optional dependency: one imports it at module level (not
    under `try: ... except ImportError`), or imports (at module level) a project module that does."""
    optional = set(optional)
    direct: set[str] = set()
    importers: dict[str, set[str]] = {}  # module -> project modules that import it at module level
    for imp in imports:
        if imp.function is not None or imp.guarded:
            continue
        if imp.target.split(".")[0] in optional:
            direct.add(imp.module)
        target = _internal(imp.target, modules)
        if target is not None:
            importers.setdefault(target, set()).add(imp.module)
    needs, todo = set(direct), list(direct)
    while todo:
        for importer in importers.get(todo.pop(), ()):
            if importer not in needs:
                needs.add(importer)
                todo.append(importer)
    return needs


def function_level_imports(modules: Mapping[str, Path], imports: list[Import],
                           optional: Iterable[str] = OPTIONAL_DEPENDENCIES) -> list[Import]:
    """Function-level imports that are neither of an optional dependency nor of a project module that
    needs one."""
    optional = set(optional)
    needs = needs_optional(modules, imports, optional)
    bad: dict[tuple[Path, int], Import] = {}  # one entry per statement (`from x import a, b` names two)
    for imp in imports:
        if imp.function is None or imp.target.split(".")[0] in optional:
            continue
        if _internal(imp.target, modules) in needs:
            continue
        bad.setdefault((imp.path, imp.line), imp)
    return list(bad.values())


def describe_function_level_imports(found: list[Import], optional: Iterable[str] = OPTIONAL_DEPENDENCIES) -> str:
    head = (f"{len(found)} function-level import(s) of something other than an optional dependency "
            f"({', '.join(sorted(optional))}) or a project module that needs one:")
    return "\n".join([head] + [f"  {imp.where}" for imp in found])


# ---------------------------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--package", type=Path, default=DEFAULT_PACKAGE, help="the package directory to check")
    ap.add_argument("--max-lines", type=int, default=MAX_LINES)
    args = ap.parse_args(argv)
    modules, imports = collect_imports(args.package)
    graph = import_graph(modules, imports)
    cycles = find_cycles(graph)
    packages = package_graph(graph)
    package_cycles = find_cycles(packages)
    long = long_modules(modules, args.max_lines)
    lazy = function_level_imports(modules, imports)
    print(f"{len(modules)} modules, {sum(len(v) for v in graph.values())} import edges between them")
    sections = [
        ("import cycles between modules", describe_cycles(graph, cycles) if cycles else ""),
        ("import cycles between packages",
         describe_cycles(packages, package_cycles, "packages") if package_cycles else ""),
        (f"modules over {args.max_lines} lines", describe_long_modules(long, args.max_lines)),
        ("function-level imports", describe_function_level_imports(lazy) if lazy else ""),
    ]
    for title, text in sections:
        print(f"\n== {title}: {'none' if not text else ''}")
        if text:
            print(text)
    return 1 if (cycles or package_cycles or long or lazy) else 0


if __name__ == "__main__":
    sys.exit(main())

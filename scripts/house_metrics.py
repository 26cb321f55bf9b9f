"""House metrics for the lbbench package: size, import circles, lazy imports, long functions.

Usage: python scripts/house_metrics.py [--root DIR]   (DIR holds the `lbbench/` package; default: this checkout)

What it prints, and how each figure is counted:

- Lines: every line of every `.py` file under `lbbench/` (total), and the lines of code among them (neither
  blank nor a comment-only line).
- Imports of lbbench: one count per `import`/`from ... import` statement whose target is inside lbbench
  (absolute `lbbench...` or relative). A statement inside a function or method body counts as "in functions";
  any other (module body, class body, module-level `if`/`try`) counts as "at file tops". Statements under
  `if TYPE_CHECKING:` are counted apart and are not edges of the graph below (they never run); the circles they
  would add are listed on their own line.
- Lazy imports: import statements inside a function or method body, of lbbench and of other packages, each
  counted as commented when one of its lines, or the line just above it, carries a comment starting
  ``# lazy`` that says why it is lazy (an optional extra, start-up time, an import cycle).
- Module import graph: one node per module (a package is its `__init__`). `from X import a` is an edge to the
  module `X.a` when that is a module, else to `X`; `import X.Y` is an edge to `X.Y`. Both file-top and
  function-level imports are edges (a lazy import still ties the two modules together).
- Import circles: the strongly connected components of that graph with more than one module.
- Arrows running back up: collapse every module to its package one level under `lbbench` (`lbbench.cli.run`
  -> `lbbench.cli`; a top-level module such as `lbbench.core` is its own package). Two packages that reach each
  other in the collapsed graph form a package-level cycle; an arrow running back up is one module-to-module
  import edge between two different packages of the same package-level cycle. A layered tree has none: every
  arrow between packages then points one way, down.
- The ten longest functions (lines from `def` to the last line of the body, decorators excluded), by `ast`.
"""

from __future__ import annotations

import argparse
import ast
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE = "lbbench"


@dataclass
class ModuleInfo:
    """One parsed module: its name, whether it is a package, and its lbbench import statements."""

    name: str
    is_package: bool
    tree: ast.Module
    lines_total: int
    lines_code: int
    lines: list[str] = field(default_factory=list)
    edges_top: set[str] = field(default_factory=set)
    edges_function: set[str] = field(default_factory=set)
    edges_type_checking: set[str] = field(default_factory=set)
    num_imports_top: int = 0
    num_imports_function: int = 0
    num_imports_type_checking: int = 0
    #: lazy imports: (of lbbench, commented) -> count
    lazy: dict[tuple[bool, bool], int] = field(default_factory=lambda: defaultdict(int))


def module_name(path: Path, root: Path) -> tuple[str, bool]:
    parts = list(path.relative_to(root).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    if is_package:
        parts = parts[:-1]
    return ".".join(parts), is_package


def count_code_lines(text: str) -> int:
    return sum(1 for line in text.splitlines() if line.strip() and not line.strip().startswith("#"))


def load_modules(root: Path) -> dict[str, ModuleInfo]:
    modules: dict[str, ModuleInfo] = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        text = path.read_text()
        name, is_package = module_name(path, root)
        modules[name] = ModuleInfo(
            name=name,
            is_package=is_package,
            tree=ast.parse(text, filename=str(path)),
            lines_total=len(text.splitlines()),
            lines_code=count_code_lines(text),
            lines=text.splitlines(),
        )
    return modules


def resolve_base(info: ModuleInfo, node: ast.ImportFrom) -> str:
    """The absolute module name a `from ... import` statement starts from."""
    if node.level == 0:
        return node.module or ""
    package_parts = info.name.split(".") if info.is_package else info.name.split(".")[:-1]
    if node.level > 1:
        package_parts = package_parts[: len(package_parts) - (node.level - 1)]
    base = ".".join(package_parts)
    return f"{base}.{node.module}" if node.module else base


def import_targets(info: ModuleInfo, node: ast.Import | ast.ImportFrom, known: set[str]) -> set[str]:
    """The lbbench modules one import statement reaches (empty when it imports nothing of lbbench)."""
    targets: set[str] = set()
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name == PACKAGE or alias.name.startswith(PACKAGE + "."):
                targets.add(nearest_module(alias.name, known))
        return targets
    base = resolve_base(info, node)
    if not (base == PACKAGE or base.startswith(PACKAGE + ".")):
        return targets
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        targets.add(sub if sub in known else nearest_module(base, known))
    return targets


def is_self_import(info: ModuleInfo, node: ast.Import | ast.ImportFrom) -> bool:
    """An import of lbbench that names only the module itself (no edge, but an lbbench import all the same)."""
    if isinstance(node, ast.Import):
        return any(a.name == PACKAGE or a.name.startswith(PACKAGE + ".") for a in node.names)
    base = resolve_base(info, node)
    return base == PACKAGE or base.startswith(PACKAGE + ".")


def nearest_module(name: str, known: set[str]) -> str:
    while name not in known and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def is_type_checking_guard(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
    )


def says_why_lazy(info: ModuleInfo, node: ast.Import | ast.ImportFrom) -> bool:
    """A ``# lazy`` comment on one of the statement's lines or on the line just above it."""
    own = info.lines[node.lineno - 1:node.end_lineno]
    above = info.lines[node.lineno - 2].strip() if node.lineno > 1 else ""
    return any("# lazy" in line for line in own) or above.startswith("# lazy")


def collect_imports(info: ModuleInfo, known: set[str]) -> None:
    def visit(node: ast.AST, in_function: bool, type_checking: bool) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            targets = import_targets(info, node, known) - {info.name}
            if in_function and not type_checking:
                info.lazy[(bool(targets) or is_self_import(info, node), says_why_lazy(info, node))] += 1
            if not targets:
                return
            if type_checking:
                info.num_imports_type_checking += 1
                info.edges_type_checking |= targets
            elif in_function:
                info.num_imports_function += 1
                info.edges_function |= targets
            else:
                info.num_imports_top += 1
                info.edges_top |= targets
            return
        inner_function = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        inner_type_checking = type_checking or is_type_checking_guard(node)
        for child in ast.iter_child_nodes(node):
            if is_type_checking_guard(node) and child in getattr(node, "orelse", []):
                visit(child, inner_function, type_checking)
            else:
                visit(child, inner_function, inner_type_checking)

    visit(info.tree, False, False)


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative; components returned sorted, each sorted."""
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
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
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
                components.append(sorted(component))
    return sorted(components)


def top_package(name: str) -> str:
    parts = name.split(".")
    return ".".join(parts[:2])


def longest_functions(modules: dict[str, ModuleInfo], count: int) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                qualified = f"{prefix}.{child.name}"
                if not isinstance(child, ast.ClassDef):
                    found.append((child.end_lineno - child.lineno + 1, qualified))
                visit(child, qualified)
            else:
                visit(child, prefix)

    for info in modules.values():
        visit(info.tree, info.name)
    return sorted(found, key=lambda item: (-item[0], item[1]))[:count]


def report(root: Path) -> str:
    modules = load_modules(root)
    known = set(modules)
    for info in modules.values():
        collect_imports(info, known)
    graph = {name: info.edges_top | info.edges_function for name, info in modules.items()}
    circles = [component for component in strongly_connected(graph) if len(component) > 1]

    package_graph: dict[str, set[str]] = defaultdict(set)
    for name, targets in graph.items():
        package_graph[top_package(name)]
        for target in targets:
            if top_package(target) != top_package(name):
                package_graph[top_package(name)].add(top_package(target))
    package_cycles = [c for c in strongly_connected(dict(package_graph)) if len(c) > 1]
    cycle_of = {package: i for i, cycle in enumerate(package_cycles) for package in cycle}
    back_arrows = sorted(
        (name, target)
        for name, targets in graph.items()
        for target in targets
        if top_package(name) != top_package(target)
        and top_package(name) in cycle_of
        and cycle_of.get(top_package(target)) == cycle_of[top_package(name)]
    )

    out: list[str] = []
    out.append(f"modules: {len(modules)}")
    out.append(f"lines: {sum(i.lines_total for i in modules.values())} total, "
               f"{sum(i.lines_code for i in modules.values())} of code")
    out.append(f"lbbench imports: {sum(i.num_imports_function for i in modules.values())} in functions, "
               f"{sum(i.num_imports_top for i in modules.values())} at file tops, "
               f"{sum(i.num_imports_type_checking for i in modules.values())} under TYPE_CHECKING")
    lazy: dict[tuple[bool, bool], int] = defaultdict(int)
    for info in modules.values():
        for key, n in info.lazy.items():
            lazy[key] += n
    out.append(f"lazy imports of lbbench: {lazy[(True, True)]} commented, {lazy[(True, False)]} uncommented; "
               f"of other packages: {lazy[(False, True)]} commented, {lazy[(False, False)]} uncommented")
    out.append(f"import circles: {len(circles)}")
    for component in circles:
        out.append(f"  ({len(component)}) " + " ".join(component))
    typed_graph = {name: graph[name] | info.edges_type_checking for name, info in modules.items()}
    typed_circles = [c for c in strongly_connected(typed_graph) if len(c) > 1 and c not in circles]
    out.append(f"further circles when TYPE_CHECKING imports count too: {len(typed_circles)}")
    for component in typed_circles:
        out.append(f"  ({len(component)}) " + " ".join(component))
    out.append(f"package-level cycles: {len(package_cycles)}")
    for cycle in package_cycles:
        out.append("  " + " ".join(cycle))
    out.append(f"arrows running back up: {len(back_arrows)}")
    for source, target in back_arrows:
        lazy = "" if target in modules[source].edges_top else "  (in a function)"
        out.append(f"  {source} -> {target}{lazy}")
    out.append("longest functions:")
    for num_lines, qualified in longest_functions(modules, 10):
        out.append(f"  {num_lines:4d}  {qualified}")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent,
                        help="directory holding the lbbench package")
    args = parser.parse_args()
    print(report(args.root))


if __name__ == "__main__":
    main()

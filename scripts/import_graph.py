"""The import graph of harness/: its modules, the imports between them (every `import` in a module, those inside
functions and under `if TYPE_CHECKING:` too), its cycles (Tarjan's strongly connected components) and the
imports that run up the layers (LAYERS, bottom to top, after shared/reference/design.md's drawing).

    python scripts/import_graph.py [harness/]        # figures, cycles and upward imports
    python scripts/import_graph.py --edges           # every import, `a -> b`

tests/test_import_graph.py keeps the figures.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

HARNESS = Path(__file__).resolve().parent.parent / "harness"

# Bottom to top. A module is in the layer of the longest prefix that names it (each module of harness/ itself by
# its own name); an import within one layer never runs up. Modules of one package sit in different layers
# where the package spans them (compare's expectations and findings are the vocabulary of the case schema; its
# comparisons of dumps and trees sit above). The case file is read in three layers: the hardened YAML reader
# (yamlio) beside schema, the strict base of every user format, at the bottom (profiles and maps use it too);
# the schema (case) and sweep expansion above the frameworks (a side names one); loading (load: families, user
# functions, profiles) above ops.
LAYERS: list[tuple[str, ...]] = [
    ("harness.errors", "harness.dtypes", "harness.rounding", "harness.plugins", "harness.reaper", "harness.schema",
     "harness.yamlio", "harness.sharding"),
    ("harness.machine",),
    ("harness.store",),
    ("harness.compare.expectations", "harness.compare.findings", "harness.compare.exact", "harness.compare.metrics",
     "harness.compare.heatmap", "harness.compare.pairs", "harness.compare.arbiter"),
    ("harness.golden_policy",),
    ("harness.frameworks",),
    ("harness.numerics",),  # a profile's framework sections are the adapters' pins
    ("harness.fingerprint",),  # assembled from the machine, the adapter and the profile
    ("harness.case", "harness.sweep"),
    ("harness.ops",),
    ("harness.load",),
    ("harness.compare",),
    ("harness.inputs",),
    ("harness.capture",),
    ("harness.execute", "harness.worker", "harness.runner", "harness.protocol", "harness.run_options"),
    ("harness.gate",),
    ("harness.reports",),
    ("harness.cli", "harness.cli_text", "harness.pytest_plugin", "harness.__main__", "harness"),
]


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, name: str, known: set[str]) -> set[str]:
    """The harness modules `path` (module `name`) imports, anywhere in it."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name and target.startswith("harness"):
                found.add(target)
    return found


def layer_of(module: str) -> int:
    best, length = -1, -1
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            # a package covers its modules, but `harness` only itself: a new top-level module must be placed
            covers = module == prefix or ("." in prefix and module.startswith(prefix + "."))
            if covers and len(prefix) > length:
                best, length = index, len(prefix)
    if best < 0:
        raise SystemExit(f"{module}: in no layer of scripts/import_graph.py LAYERS: add it")
    return best


@dataclass
class Graph:
    modules: list[str]
    edges: list[tuple[str, str]]

    @property
    def cycles(self) -> list[list[str]]:
        """The strongly connected components of more than one module (Tarjan), each sorted."""
        adjacent: dict[str, list[str]] = {m: [] for m in self.modules}
        for a, b in self.edges:
            adjacent[a].append(b)
        index: dict[str, int] = {}
        low: dict[str, int] = {}
        stack: list[str] = []
        on_stack: set[str] = set()
        components: list[list[str]] = []

        def strong(v: str) -> None:
            index[v] = low[v] = len(index)
            stack.append(v)
            on_stack.add(v)
            for w in adjacent[v]:
                if w not in index:
                    strong(w)
                    low[v] = min(low[v], low[w])
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    components.append(sorted(component))

        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(limit, 10 * len(self.modules) + 100))
        try:
            for v in self.modules:
                if v not in index:
                    strong(v)
        finally:
            sys.setrecursionlimit(limit)
        return sorted(components)

    @property
    def upward(self) -> list[tuple[str, str]]:
        """The imports from a module to one in a higher layer."""
        return sorted((a, b) for a, b in self.edges if layer_of(b) > layer_of(a))


def graph(root: Path = HARNESS) -> Graph:
    files = {module_name(path, root): path for path in sorted(root.rglob("*.py"))}
    known = set(files)
    edges = []
    for name, path in files.items():
        for target in sorted(imports_of(path, name, known)):
            # a module importing its own package (or the package `harness` itself: __version__) is just python
            if target == "harness" or name.startswith(target + "."):
                continue
            edges.append((name, target))
    return Graph(sorted(files), edges)


def main(argv: list[str]) -> int:
    args = [arg for arg in argv if not arg.startswith("--")]
    g = graph(Path(args[0]) if args else HARNESS)
    if "--edges" in argv:
        for a, b in g.edges:
            print(f"{a} -> {b}")
        return 0
    print(f"{len(g.modules)} modules, {len(g.edges)} imports, {len(LAYERS)} layers")
    print(f"cycles: {len(g.cycles)}")
    for component in g.cycles:
        print("  " + " <-> ".join(component))
    print(f"upward imports: {len(g.upward)}")
    for a, b in g.upward:
        print(f"  {a} -> {b}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

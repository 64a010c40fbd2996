"""The import graph of harness/ (scripts/import_graph.py): its cycles and the imports that run up the layers
stay within the ceilings below, which only go down (the aim: no cycle, at most 3 upward imports)."""

import ast
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

from import_graph import HARNESS, LAYERS, graph, layer_of  # noqa: E402

MAX_CYCLES = 0
MAX_UPWARD = 0


def test_every_module_has_a_layer():
    for module in graph().modules:
        assert 0 <= layer_of(module) < len(LAYERS)


def test_import_cycles_within_the_ceiling():
    cycles = graph().cycles
    assert len(cycles) <= MAX_CYCLES, "\n".join(" <-> ".join(c) for c in cycles)


def test_upward_imports_within_the_ceiling():
    upward = graph().upward
    assert len(upward) <= MAX_UPWARD, "\n".join(f"{a} -> {b}" for a, b in upward)


def test_no_cycle_through_the_storage_layer_and_frameworks():
    for cycle in graph().cycles:
        assert not any(m.startswith(("harness.store", "harness.frameworks", "harness.machine", "harness.fingerprint"))
                       for m in cycle), cycle


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_only_the_entry_points_import_capture():
    """capture/ is a producer: compare/, reports/, frameworks/, store/ and the gate never ask which producer made a
    dump; only the package's API, the CLI and the pytest plugin use it."""
    users = ("harness", "harness.cli", "harness.pytest_plugin")
    wrong = [(a, b) for a, b in graph().edges
             if _within(b, "harness.capture") and not _within(a, "harness.capture") and a not in users]
    assert not wrong, wrong


# What only harness/store/ names: the files of a dump, a golden and a capture tree, and safetensors files in general.
STORE_FILE_ENDINGS = ("meta.json", "capture.json", ".golden.yaml", ".golden.obtained.yaml", ".safetensors")
STORE_FILE_NAMES = {"TENSORS_FILE", "META_FILE", "DUMP_FILES", "MANIFEST_FILE", "OBTAINED_SUFFIX"}
# The plugin keeps goldens from being collected as cases, and imports no harness module before a case is collected.
ALLOWED = {("pytest_plugin.py", "GOLDEN_SUFFIXES")}


def _store_file_uses(text: str, relative: str) -> list[str]:
    """Where the module `relative` (its source: `text`) reads or writes a store file itself: an import of
    safetensors' file functions or of store/'s file names, a text (not a docstring) that ends with a store
    file's name."""
    tree = ast.parse(text, relative)
    skipped = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            skipped.add(id(body[0].value))  # a docstring
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and (relative, t.id) in ALLOWED
                                                for t in node.targets):
            skipped |= {id(n) for n in ast.walk(node.value)}
    uses = []
    for node in ast.walk(tree):
        where = f"{relative}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import):
            uses += [f"{where} import {a.name}" for a in node.names if _within(a.name, "safetensors")]
        elif isinstance(node, ast.ImportFrom) and node.module and _within(node.module, "safetensors"):
            uses += [f"{where} from {node.module} import {a.name}" for a in node.names if a.name != "SafetensorError"]
        elif isinstance(node, ast.ImportFrom) and node.module and _within(node.module, "harness.store"):
            uses += [f"{where} import {a.name}" for a in node.names if a.name in STORE_FILE_NAMES]
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skipped
              and node.value.endswith(STORE_FILE_ENDINGS)):
            uses.append(f"{where} {node.value!r}")
    return uses


def test_dumps_goldens_and_trees_are_read_and_written_only_in_store():
    modules = [path for path in sorted(HARNESS.rglob("*.py")) if path.relative_to(HARNESS).parts[0] != "store"]
    assert len(modules) > 50
    uses = [use for path in modules for use in _store_file_uses(path.read_text(), path.relative_to(HARNESS).as_posix())]
    assert not uses, uses


def test_the_store_file_check_finds_what_it_looks_for():
    text = ('"""names meta.json"""\nfrom safetensors import SafetensorError\nfrom safetensors.numpy import load_file\n'
            'from harness.store.dump import META_FILE, Dump\nGOLDEN_SUFFIXES = (".golden.yaml",)\n'
            'def f(stem):\n    """reads x.golden.yaml"""\n    return f"{stem}.golden.yaml", "a capture tree (capture.json)"\n')
    assert sorted(use.split(" ", 1)[1] for use in _store_file_uses(text, "probe.py")) == [
        "'.golden.yaml'", "'.golden.yaml'", "from safetensors.numpy import load_file", "import META_FILE"]
    assert [use.split(" ", 1)[1] for use in _store_file_uses(text, "pytest_plugin.py")] == [
        "from safetensors.numpy import load_file", "import META_FILE", "'.golden.yaml'"]

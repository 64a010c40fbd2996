"""The import graph of harness/ (scripts/import_graph.py): its cycles and the imports that run up the layers
stay within the ceilings below, which only go down (the aim: no cycle, at most 3 upward imports)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

from import_graph import LAYERS, graph, layer_of  # noqa: E402

# Left (the lead decides how to break them):
# - capture.replay <-> capture.replay_exact: replay_exact needs replay's ReplayResult, run_modules,
#   captured_parameter and first_line; replay calls replay_exact.
# - case <-> numerics <-> ops <-> ops.family: case.py still loads (validate_cases, expand_sweep call
#   ops.family_for; _check_numerics calls numerics.load_profile), numerics reads YAML with case.read_yaml, and
#   ops use the Case schema: needs case.py split into schema, YAML reader, sweeps and loading.
MAX_CYCLES = 2
# Left: case -> ops, numerics -> case (the same split), store.dump -> case and store.dump -> compare.expectations
# (a dump's meta validates the case's expect block).
MAX_UPWARD = 4


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


def test_compare_reports_and_frameworks_import_nothing_from_capture():
    g = graph()
    wrong = [(a, b) for a, b in g.edges if b.startswith("harness.capture")
             and a.startswith(("harness.compare", "harness.reports", "harness.frameworks", "harness.store"))]
    assert not wrong, wrong

"""Bad input is refused before anything runs, with one line `file:line: field: ...` (exit 2, no traceback):
unsafe names, duplicate keys, bools as dimensions, non-UTF-8 files, runaway shape expressions, malformed
YAML of every shape, inputs over the size limit, user functions that are not there or return the wrong
thing; a GPU case on a machine without one is N/A; the pytest plugin reports a broken case file as one
collection error and collects only the case paths it is given."""

import dataclasses
import os
import re
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import harness.inputs
from harness.case import CaseError, InputSpec
from harness.cli import main
from harness.compare.case import compare_dumps
from harness.dtypes import to_numpy_dtype
from harness.execute import UserFunctionError, execute
from harness.frameworks import adapter_for
from harness.inputs import check_input_size, generate_input, generate_inputs
from harness.load import load_case, load_cases
from harness.reports.html import report_file_names, write_reports

from conftest import ROOT, SMALL_WEIGHTED
from report_fixtures import known_diff_dumps

# SMALL_WEIGHTED, line by line: 1 op, 2 options, 3 seed, 4 inputs, 5 x, 6 probs, 7 grad_out, 8 sides,
# 9 megatron, 10 paddle, 11 expect, 12 all.
WITH_VARS = "vars: {tokens: 16}\n" + SMALL_WEIGHTED  # every line one further down; x is on line 6


def error_of(path) -> str:
    with pytest.raises(CaseError) as info:
        load_cases(path)
    message = str(info.value)
    assert "\n" not in message, message
    return message


def assert_cli_refuses(path, capsys, start: str) -> None:
    """`xfalign run` exits 2 with the one line, and no traceback anywhere."""
    assert main(["run", str(path)]) == 2
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert err.strip().startswith(f"xfalign: error: {start}"), err
    assert len(err.strip().splitlines()) == 1, err


# --- 1. names are not paths ---------------------------------------------------------------------

@pytest.mark.parametrize("name", ["../../../x", "javascript:alert(1)", "/etc/passwd", "a/b", "a\\\\b", "..", ".hidden",
                                  "a..b", "x y", "-rf", "a" * 129, "caf\u00e9"])
def test_unsafe_case_names_are_refused(write_case, capsys, name):
    path = write_case(f"name: {yaml.safe_dump(name).splitlines()[0]}\n" + SMALL_WEIGHTED)
    message = error_of(path)
    assert message.startswith(f"{path}:1: name: ") and "is not a safe case name" in message, message
    assert_cli_refuses(path, capsys, f"{path}:1: name: ")


def test_name_from_an_unsafe_file_name_is_refused_with_a_hint(write_case):
    path = write_case(SMALL_WEIGHTED, "my case.yaml")
    message = error_of(path)
    assert message.startswith(f"{path}:1: name: 'my case' is not a safe case name") and "set name:" in message


def test_safe_names_and_sweep_point_ids_are_accepted(write_case):
    (case,) = load_cases(write_case("name: swiglu_v1.2-b\n" + SMALL_WEIGHTED))
    assert case.name == "swiglu_v1.2-b"
    points = load_cases(write_case(SMALL_WEIGHTED.replace("seed: 3", "sweep: {seed: [1, 2]}")))
    assert [p.name for p in points] == ["case[seed=1]", "case[seed=2]"]


def test_unsafe_side_name_is_refused(write_case):
    path = write_case(SMALL_WEIGHTED.replace("  paddle: {", "  ../../p: {"))
    assert error_of(path).startswith(f"{path}:10: sides.../../p: '../../p' is not a safe side name")


def test_sweep_value_with_a_path_separator_is_refused(write_case):
    path = write_case(SMALL_WEIGHTED.replace("seed: 3", "seed: 3\nsweep: {inputs.x.dtype: [bfloat16, ../x]}"))
    assert error_of(path).startswith(f"{path}:4: sweep.inputs.x.dtype: sweep value '../x' cannot be part of a point id")


def test_report_file_names_are_safe_distinct_and_links_relative(tmp_path):
    comparison = compare_dumps(*known_diff_dumps(rows=16, cols=8))
    names = ["javascript:alert(1)", "../../escape", "moe[topk=1,dtype=bf16]", "a/b", "a:b", "index", "A_B"]
    comparisons = [dataclasses.replace(comparison, case_name=name) for name in names]
    folder = tmp_path / "reports"
    index = write_reports(comparisons, folder)
    assert index == folder / "index.html"
    written = sorted(p.name for p in tmp_path.rglob("*.html"))
    assert all((folder / name).exists() for name in written)  # nothing outside the folder
    assert report_file_names(names) == ["javascript_alert_1.html", "escape.html", "moe_topk_1_dtype_bf16.html",
                                        "a_b.html", "a_b-2.html", "index-2.html", "A_B-3.html"]
    assert sorted(written) == sorted(report_file_names(names) + ["index.html"])
    hrefs = re.findall(r'href="([^"]*)"', index.read_text())
    assert hrefs == report_file_names(names)
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", href) for href in hrefs)  # relative file links, no scheme


# --- 2. inputs are checked before anything runs -------------------------------------------------

def test_duplicate_keys_are_refused(write_case, capsys):
    top = write_case(SMALL_WEIGHTED.replace("seed: 3", "seed: 3\nseed: 4"), "top.yaml")
    assert error_of(top) == f"{top}:4: seed: duplicate key 'seed' (first at line 3)"
    nested = write_case(SMALL_WEIGHTED.replace("dtype: float32, dist: uniform", "dtype: float32, dtype: bfloat16"),
                        "nested.yaml")
    assert error_of(nested) == f"{nested}:6: inputs.probs.dtype: duplicate key 'dtype' (first at line 6)"
    side = write_case(SMALL_WEIGHTED.replace("  paddle: {framework: paddle, impl: fp32_island}",
                                             "  paddle: {framework: paddle, impl: fp32_island}\n"
                                             "  paddle: {framework: paddle, impl: per_op_rounding}"))
    assert error_of(side) == f"{side}:11: sides.paddle: duplicate key 'paddle' (first at line 10)"
    assert_cli_refuses(top, capsys, f"{top}:4: seed: duplicate key")


def test_merge_keys_are_not_duplicates(write_case):
    text = SMALL_WEIGHTED.replace("  megatron: {framework: megatron, mode: compile}",
                                  "  megatron: &m {framework: megatron, mode: compile}")
    text = text.replace("  paddle: {framework: paddle, impl: fp32_island}",
                        "  paddle: {<<: *m, framework: paddle, impl: fp32_island, mode: null}")
    assert load_case(write_case(text)).sides["paddle"].framework == "paddle"


@pytest.mark.parametrize("dim, words", [("true", "got the boolean true"), ("false", "got the boolean false"),
                                        ("2.0", "got the number 2.0"), ("[16]", "got a list")])
def test_a_dimension_is_an_integer_not_a_bool(write_case, capsys, dim, words):
    path = write_case(SMALL_WEIGHTED.replace("shape: [16, 64]", f"shape: [{dim}, 64]"))
    assert error_of(path) == f"{path}:5: inputs.x.shape.0: Input should be a valid integer, {words}"
    if dim == "true":
        assert_cli_refuses(path, capsys, f"{path}:5: inputs.x.shape.0: ")


@pytest.mark.parametrize("old, new, field, words", [
    ("seed: 3", "seed: true", "seed", "valid integer"),
    ("seed: 3", "seed: -1", "seed", "greater than or equal to 0"),
    ("std: 2.0", "std: -2.0", "inputs.x.std", "greater than or equal to 0"),
    ("std: 2.0", "std: .nan", "inputs.x.std", "finite number"),
    ("dist: uniform", "dist: uniform, low: -1.0e308, high: 1.0e308", "inputs.probs", "finite number"),
    ("all: bitwise", "all: {max_ulp: true}", "expect.all.max_ulp", "valid integer"),
])
def test_numbers_numpy_would_choke_on_are_refused(write_case, old, new, field, words):
    path = write_case(SMALL_WEIGHTED.replace(old, new))
    message = error_of(path)
    assert re.match(rf"{re.escape(str(path))}:\d+: {re.escape(field)}: ", message) and words in message, message


def test_non_utf8_case_file_is_one_line(tmp_path, capsys):
    path = tmp_path / "latin1.yaml"
    path.write_bytes(SMALL_WEIGHTED.replace("op: swiglu", "# caf\xe9\nop: swiglu").encode("latin-1"))
    assert error_of(path) == f"{path}:1: (file): not UTF-8 text (byte 0xe9 at offset 5); save the case file as UTF-8"
    assert_cli_refuses(path, capsys, f"{path}:1: (file): not UTF-8 text")


@pytest.mark.parametrize("expression, words", [
    ("tokens // 0", "division by zero in 'tokens // 0'"),
    ("tokens // (tokens - 16)", "division by zero"),
    (" + ".join(["tokens"] * 20_000), "at most 200 characters, this one has 179,997"),
    ("(" * 40 + "tokens" + "+1)" * 40, "at most 32 operations"),
    ("(" * 150 + "tokens" + ")" * 150, "at most 200 characters"),
    (" * ".join(["tokens"] * 12), "too large for a dimension"),
    ("1" + "0" * 30, "too large for a dimension"),
    ("tokens ** 2", "cannot evaluate"),
    ("tokens +", "is not an expression"),
    ('__import__("os")', "cannot evaluate"),
])
def test_shape_expression_errors_name_file_line_field(write_case, capsys, expression, words):
    path = write_case(WITH_VARS.replace("shape: [16, 64]", f"shape: ['{expression}', 64]"))
    message = error_of(path)
    assert message.startswith(f"{path}:6: inputs.x.shape.0: ") and words in message, message
    if "//" in expression:
        assert_cli_refuses(path, capsys, f"{path}:6: inputs.x.shape.0: division by zero")


MALFORMED = [
    ("inputs as a list", SMALL_WEIGHTED.replace("  x: {", "  - x: {").replace("  probs: {", "  - probs: {")
     .replace("  grad_out: {", "  - grad_out: {"), "4: inputs: inputs is a mapping (name: {shape, dtype, ...}), got a list"),
    ("an input as a list", SMALL_WEIGHTED.replace("  x: {shape: [16, 64], dtype: bfloat16, std: 2.0}", "  x: [16, 64]"),
     "5: inputs.x: an input is a mapping"),
    ("an input as a number", SMALL_WEIGHTED.replace("  x: {shape: [16, 64], dtype: bfloat16, std: 2.0}", "  x: 5"),
     "5: inputs.x: an input is a mapping"),
    ("sides as a number", SMALL_WEIGHTED.replace("sides:\n", "sides: 2\nq:\n"), "8: sides: sides is a mapping"),
    ("sides as a list", SMALL_WEIGHTED.replace("  megatron: {", "  - megatron: {").replace("  paddle: {", "  - paddle: {"),
     "8: sides: sides is a mapping"),
    ("a side as text", SMALL_WEIGHTED.replace("{framework: paddle, impl: fp32_island}", "paddle"),
     "10: sides.paddle: a side is a mapping"),
    ("options as a list", SMALL_WEIGHTED.replace("{weighted: true}", "[weighted]"), "2: options: options is a mapping"),
    ("an option named by a number", SMALL_WEIGHTED.replace("{weighted: true}", "{1: true}"),
     "2: options.1: a name in options is text"),
    ("vars as a list", "vars: [1, 2]\n" + SMALL_WEIGHTED, "1: vars: vars is a mapping"),
    ("expect as text", SMALL_WEIGHTED.replace("expect:\n  all: bitwise", "expect: bitwise"), "11: expect: expect is a mapping"),
    ("expect points as a list", SMALL_WEIGHTED.replace("seed: 3", "sweep: {seed: [1, 2]}") + "  points: [1]\n",
     "13: expect.points: points is a mapping"),
    ("sweep as a list", "sweep: [seed]\n" + SMALL_WEIGHTED, "1: sweep: sweep is a mapping"),
    ("a sweep label by number", "sweep: {1: [2]}\n" + SMALL_WEIGHTED, "1: sweep.1: a name in sweep is text"),
    ("a sweep into a list", SMALL_WEIGHTED.replace("seed: 3", "sweep: {inputs.x.shape.0: [4]}"),
     "3: sweep.inputs.x.shape.0: no field 'shape' on the way"),
    ("a sweep of 10**6 points", "sweep: {a: [" + ", ".join("1" * 100) + "], b: [" + ", ".join("1" * 100) + "], c: ["
     + ", ".join("1" * 100) + "]}\n" + SMALL_WEIGHTED, "1: sweep: this sweep has 1,000,000 points"),
    ("a list at the top", "- 1\n- 2\n", "1: (top level): a case is a mapping of fields, got a list"),
    ("an empty file", "", "1: (top level): a case is a mapping of fields, got nothing"),
    ("a number at the top", "42\n", "1: (top level): a case is a mapping of fields, got the number 42"),
    ("two documents", SMALL_WEIGHTED + "---\nop: swiglu\n", "13: (yaml): but found another document"),
    ("a recursive alias", "a: &x [*x]\n", "1: a.0: an alias refers to a value that contains it"),
    ("billion laughs", "".join(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}" if i else "x"] * 10) + "]\n" for i in range(9)),
     ": the file expands to more than 100,000 values"),
    ("deep nesting", "a: " + "[" * 2000 + "]" * 2000 + "\n", "1: (yaml): nested too deeply to read"),
    ("moderately deep nesting", "a: " + "[" * 40 + "]" * 40 + "\n", ": nested more than 32 levels deep"),
    ("a NUL character", "op: swiglu\x00\n", "1: (yaml): unacceptable character #x0000"),
    ("a tab indent", "op: swiglu\ninputs:\n\tx: 1\n", "3: (yaml): found character '\\t'"),
    ("an unclosed bracket", SMALL_WEIGHTED.replace("[16, 64]", "[16, 64"), ": (yaml): "),
    ("a complex key", "? [a, b]\n: 1\n", "1: (yaml): found unhashable key"),
    ("a field named by a number", "1: 2\n" + SMALL_WEIGHTED, "1: 1: a field name is text"),
    ("a name that is a list", "name: [a]\n" + SMALL_WEIGHTED, "1: name: a case name is text, got a list"),
    ("an op that is a list", SMALL_WEIGHTED.replace("op: swiglu", "op: [swiglu]"), "1: op: Input should be a valid string, got a list"),
]


@pytest.mark.parametrize("text, words", [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_malformed_yaml_is_one_line_never_a_traceback(write_case, capsys, text, words):
    path = write_case(text)
    message = error_of(path)
    assert message.startswith(f"{path}:") and words in message, message
    assert re.match(rf"{re.escape(str(path))}:\d+: [^:]+: .", message), message  # file:line: field: ...
    assert_cli_refuses(path, capsys, f"{path}:")


def test_oversized_case_file_is_refused(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text(SMALL_WEIGHTED + "description: '" + "x" * (1 << 20) + "'\n")
    assert error_of(path).startswith(f"{path}:1: (file): the case file has 1,048,9")


# Random damage to a valid case, as parsed YAML and as text: always a loaded case or one CaseError line.
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2 ** 70), 2 ** 70) | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6)


def _paths(data, prefix=()):
    yield prefix
    if isinstance(data, dict):
        for key, value in data.items():
            yield from _paths(value, prefix + (key,))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            yield from _paths(value, prefix + (index,))


def _replace(data, path, value):
    if not path:
        return value
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return data


def _assert_loads_or_one_line(path: Path) -> None:
    try:
        load_cases(path)
    except CaseError as error:
        message = str(error)
        assert "\n" not in message and message.startswith(str(path)), message
        assert "cannot be validated" not in message, message  # every shape met here has its own check


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(choice=st.integers(0, 10 ** 6), value=VALUES)
def test_random_values_anywhere_give_a_case_or_one_line(tmp_path, choice, value):
    data = yaml.safe_load(WITH_VARS.replace("shape: [16, 64]", "shape: [tokens, 64]"))
    paths = list(_paths(data))
    data = _replace(data, paths[choice % len(paths)], value)
    path = tmp_path / "fuzz.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True))
    _assert_loads_or_one_line(path)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(at=st.integers(0, 10 ** 6), cut=st.integers(0, 12), insert=st.text(alphabet="{}[],:&*!|>-?#'\"\t\n 0a.", max_size=6))
def test_random_text_damage_gives_a_case_or_one_line(tmp_path, at, cut, insert):
    at %= len(SMALL_WEIGHTED)
    path = tmp_path / "damaged.yaml"
    path.write_text(SMALL_WEIGHTED[:at] + insert + SMALL_WEIGHTED[at + cut:])
    _assert_loads_or_one_line(path)


def test_input_size_is_checked_before_allocating(write_case, capsys, monkeypatch):
    big = SMALL_WEIGHTED.replace("[16, 64]", "[1048576, 38144]").replace("[16, 1]", "[1048576, 1]")
    path = write_case(big.replace("[16, 32]", "[1048576, 19072]"))
    (case,) = load_cases(path)  # valid: the size is checked when inputs are made, against the run's limit
    with pytest.raises(CaseError) as info:
        check_input_size(case)
    assert str(info.value) == f"{path}: inputs need 111.8 GiB; limit 8 GiB (set --max-input-gib)"
    assert check_input_size(case, limit_gib=200) == 1048576 * (38144 * 2 + 4 + 19072 * 2)

    def no_allocation(*args, **kwargs):
        raise AssertionError("inputs allocated before the size check")

    monkeypatch.setattr(harness.inputs.np, "empty", no_allocation)
    with pytest.raises(CaseError, match="inputs need 111.8 GiB; limit 8 GiB"):
        generate_inputs(case)
    monkeypatch.setattr(harness.inputs, "MAX_INPUT_GIB", 0.5)
    with pytest.raises(CaseError, match="limit 0.5 GiB"):
        generate_inputs(case, max_input_gib=None)
    monkeypatch.undo()
    assert_cli_refuses(path, capsys, f"{path}: inputs need 111.8 GiB; limit 8 GiB (set --max-input-gib)")


def _old_generate_input(name: str, spec: InputSpec, case) -> np.ndarray:
    """The whole-tensor float64 generator this project used before (goldens depend on its bits)."""
    seed = spec.seed if spec.seed is not None else case.seed
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    if spec.dist == "normal":
        values = rng.normal(spec.mean, spec.std, size=spec.shape)
    else:
        values = rng.uniform(spec.low, spec.high, size=spec.shape)
    if spec.special_values and spec.special_fraction > 0:
        flat = values.reshape(-1)
        count = max(1, int(round(flat.size * spec.special_fraction)))
        where = rng.choice(flat.size, size=min(count, flat.size), replace=False)
        flat[where] = rng.choice(np.asarray(spec.special_values, dtype=np.float64), size=where.size)
    return values.astype(to_numpy_dtype(spec.dtype))


SPECS = [
    {"dist": "normal", "std": 2.0},
    {"dist": "normal", "mean": -0.5, "std": 0.01},
    {"dist": "uniform", "low": -3.0, "high": 7.0},
    {"dist": "normal", "special_values": [7.0, -7.0], "special_fraction": 0.05},
    {"dist": "uniform", "special_values": [0.0, -0.0, float("inf"), float("nan"), 1e-40], "special_fraction": 0.3},
    {"dist": "normal", "seed": 11, "special_values": [3.5], "special_fraction": 1.0},
]


@pytest.mark.parametrize("dtype", ["bfloat16", "float32", "float16", "float64"])
@pytest.mark.parametrize("chunk", [1000, 1 << 20])
def test_chunked_generation_is_bit_identical_to_the_whole_tensor(write_case, monkeypatch, dtype, chunk):
    monkeypatch.setattr(harness.inputs, "CHUNK_ELEMENTS", chunk)
    case = load_case(write_case(SMALL_WEIGHTED))
    shapes = [[37, 101], [5, 2, 1000]] if chunk == 1000 else [[1100, 1000]]
    for shape in shapes:
        for fields in SPECS:
            spec = InputSpec(shape=shape, dtype=dtype, **fields)
            new, old = generate_input("x", spec, case), _old_generate_input("x", spec, case)
            assert new.dtype == old.dtype == to_numpy_dtype(dtype) and new.shape == old.shape
            width = {2: np.uint16, 4: np.uint32, 8: np.uint64}[new.dtype.itemsize]
            assert np.array_equal(new.view(width), old.view(width)), (dtype, shape, fields)
    if dtype == "bfloat16":
        assert generate_input("x", InputSpec(shape=[4], dtype=dtype), case).dtype == ml_dtypes.bfloat16


def user_case(impl: str) -> str:
    return SMALL_WEIGHTED.replace("impl: fp32_island", f"impl: '{impl}'")


def test_user_function_file_is_found_beside_the_case_only(tmp_path, capsys):
    (tmp_path / "mine.py").write_text("def swiglu(x, bias, probs, options):\n    return x\n")  # the working directory
    cases = tmp_path / "cases"
    cases.mkdir()
    path = cases / "c.yaml"
    path.write_text(user_case("mine.py:swiglu"))
    message = error_of(path)
    assert message.startswith(f"{path}:10: sides.paddle.impl: no file mine.py beside the case (looked for {cases / 'mine.py'}")
    assert_cli_refuses(path, capsys, f"{path}:10: sides.paddle.impl: no file mine.py")
    (cases / "mine.py").write_text("import paddle\n\ndef swiglu(x, bias, probs, options):\n    return x\n")
    assert load_case(path).sides["paddle"].impl == "mine.py:swiglu"
    (cases / "sub").mkdir()
    (cases / "sub" / "k.py").write_text("if True:\n    def kernel(x, bias, probs, options):\n        return x\n")
    path.write_text(user_case("sub/k.py:kernel"))
    assert load_case(path).sides["paddle"].impl == "sub/k.py:kernel"


@pytest.mark.parametrize("impl, source, words", [
    ("mine.py:swigl", "import paddle\ndef swiglu(x, bias, probs, options):\n    return x\n",
     "mine.py defines no 'swigl' (it defines paddle, swiglu)"),
    ("mine.py:swiglu", "def swiglu(x, bias, probs, options)\n    return x\n", "mine.py cannot be read as Python (line 1)"),
    ("no_such_package_xf.mod:f", None, "no module 'no_such_package_xf.mod' on the Python path"),
    ("harness.nope:f", None, "no module 'harness.nope' on the Python path"),
    ("harness.case:no_such_function", None, "harness.case defines no 'no_such_function'"),
])
def test_missing_user_function_is_refused_at_load_time(write_case, tmp_path, capsys, impl, source, words):
    if source is not None:
        (tmp_path / "mine.py").write_text(source)
    path = write_case(user_case(impl))
    message = error_of(path)
    assert message.startswith(f"{path}:10: sides.paddle.impl: ") and words in message, message
    assert_cli_refuses(path, capsys, f"{path}:10: sides.paddle.impl: ")


def test_module_user_function_is_checked_without_importing_a_framework(write_case):
    path = write_case(user_case("torch.nn.functional:silu"))
    bad = write_case(user_case("torch.nn.functional:no_silu"), "bad.yaml")
    script = textwrap.dedent(f"""
        import sys
        from harness.case import CaseError
        from harness.load import load_case
        assert load_case({str(path)!r}).sides["paddle"].impl == "torch.nn.functional:silu"
        try:
            load_case({str(bad)!r})
        except CaseError as error:
            assert "torch.nn.functional defines no 'no_silu'" in str(error), error
        else:
            raise SystemExit("not refused")
        loaded = [m for m in ("torch", "paddle", "megatron") if m in sys.modules]
        assert not loaded, loaded
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr


def run_paddle(case):
    """The case's paddle side, run here in the test process by the real adapter."""
    return execute(case, case.sides["paddle"], generate_inputs(case), adapter_for("paddle"), "cpu")


@pytest.mark.xdist_group("in_process_frameworks")  # runs Paddle in this process
@pytest.mark.parametrize("returned, words", [
    ("x.numpy()", "returned ndarray; expected a paddle tensor (out) or a dict with 'out'"),
    ("1.5", "returned float; expected a paddle tensor (out) or a dict with 'out'"),
    ("None", "returned None; expected a paddle tensor (out) or a dict with 'out'"),
    ("(x, x)", "returned tuple; expected a paddle tensor (out) or a dict with 'out'"),
    ("{'output': x}", "returned a dict without 'out' (it has 'output'); expected a paddle tensor (out) or a dict with 'out'"),
    ("{'out': x.numpy()}", "returned 'out' as ndarray; expected a paddle tensor"),
    ("x.detach()", "returned 'out' detached from the inputs (it does not require grad); expected a paddle tensor "
                         "computed from the inputs"),
])
def test_user_function_returning_the_wrong_thing_says_what_was_expected(write_case, tmp_path, returned, words):
    (tmp_path / "f.py").write_text(f"def swiglu(x, bias, probs, options):\n    return {returned}\n")
    case = load_case(write_case(user_case("f.py:swiglu")))
    with pytest.raises(UserFunctionError) as info:
        run_paddle(case)
    assert str(info.value) == f"user function f.py:swiglu {words}" + ("" if "computed" not in words else
                                                                     ", so that gradients can be taken through it")


@pytest.mark.xdist_group("in_process_frameworks")  # runs Paddle in this process
def test_user_function_returning_a_tensor_or_a_dict_is_captured(write_case, tmp_path):
    (tmp_path / "f.py").write_text("def swiglu(x, bias, probs, options):\n    return x\n"
                                   "def as_dict(x, bias, probs, options):\n    return {'out': x}\n")
    for impl in ("f.py:swiglu", "f.py:as_dict"):
        output = run_paddle(load_case(write_case(user_case(impl))))
        assert list(output.tensors) == ["out", "grad.x"]


@pytest.mark.skipif(Path("/dev/nvidia0").exists(), reason="this machine has a GPU")
def test_cuda_without_gpu_is_not_available_not_a_crash(write_case, capsys):
    """Both sides Paddle (test_end_to_end has the torch side's N/A): one cheap worker on cuda."""
    text = SMALL_WEIGHTED.replace("  megatron: {framework: megatron, mode: compile}\n",
                                  "  per_op: {framework: paddle, impl: per_op_rounding}\n")
    path = write_case(text.replace("seed: 3", "seed: 3\ndevice: cuda"))
    assert main(["run", str(path)]) == 0
    out, err = capsys.readouterr()
    assert "N/A" in out and "Traceback" not in out + err
    assert "Paddle on cuda is not available here" in out or "Paddle sees no GPU" in out, out


# --- 3. the pytest plugin -------------------------------------------------------------------------

def test_broken_case_file_is_one_failed_item_and_others_are_collected(pytester):
    pytester.makefile(".yaml", good=SMALL_WEIGHTED, broken=SMALL_WEIGHTED.replace("seed: 3", "seed: 3\nseed: 4"),
                      unparsable=SMALL_WEIGHTED.replace("[16, 64]", "[16, 64"), unrelated="just: a yaml file\n")
    (pytester.path / "latin1.yaml").write_bytes(b"# caf\xe9\n" + SMALL_WEIGHTED.encode())
    collected = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--collect-only", "-q").stdout.str()
    assert "good.yaml::good" in collected and "unrelated" not in collected
    for name in ("broken", "unparsable", "latin1"):
        assert f"{name}.yaml::{name}.yaml" in collected
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "broken.yaml", "unparsable.yaml", "latin1.yaml")
    result.assert_outcomes(failed=3)
    text = result.stdout.str()
    assert "broken.yaml:4: seed: duplicate key 'seed' (first at line 3)" in text
    assert "unparsable.yaml:5: (yaml): " in text
    assert "latin1.yaml:1: (file): not UTF-8 text" in text
    assert "Traceback" not in text and "harness/load.py" not in text and "harness/yamlio.py" not in text


def test_only_configured_case_paths_are_collected_by_a_plain_pytest(pytester):
    pytester.makeini("[pytest]\ntestpaths = tests\nxfalign_cases =\n    cases/*.yaml\n")
    (pytester.path / "tests").mkdir()
    (pytester.path / "tests" / "fixture_case.yaml").write_text(SMALL_WEIGHTED)  # data for a test, not a case to run
    (pytester.path / "tests" / "test_x.py").write_text("def test_x():\n    pass\n")
    (pytester.path / "cases").mkdir()
    (pytester.path / "cases" / "listed.yaml").write_text(SMALL_WEIGHTED)
    (pytester.path / "other").mkdir()
    (pytester.path / "other" / "named.yaml").write_text(SMALL_WEIGHTED)
    plain = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--collect-only", "-q").stdout.str()
    assert "cases/listed.yaml::listed" in plain and "test_x.py::test_x" in plain
    assert "fixture_case" not in plain and "named" not in plain
    explicit = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--collect-only", "-q", "other").stdout.str()
    assert "other/named.yaml::named" in explicit and "listed" not in explicit
    one_file = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--collect-only", "-q",
                                             "tests/fixture_case.yaml").stdout.str()
    assert "tests/fixture_case.yaml::fixture_case" in one_file


def test_plugin_imports_no_framework_and_no_runner():
    script = ("import sys, harness.pytest_plugin\n"
              "heavy = [m for m in ('torch', 'paddle', 'megatron', 'numpy', 'harness.runner', 'harness.gate') "
              "if m in sys.modules]\n"
              "assert not heavy, heavy\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT,
                          env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert done.returncode == 0, done.stderr

"""The Paddle adapter's device digests (harness.frameworks.paddle_digest), on the CPU where a GPU's code can
run: the Paddle-ops digest and the DLPack route into torch's digest equal numpy's fast64 (and statistics) for
every dtype a dump holds, odd sizes, views, NaN/Inf, empty and 0-d tensors; Paddle's int64 arithmetic wraps;
a capture with the Paddle ops (PaddleAdapter.digest_on_cpu) writes what the default path writes. The tests
marked gpu need a Paddle CUDA build and skip without one (no machine of this project has one)."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.capture import capture
from harness.compare.tree import compare_trees
from harness.dtypes import NUMPY_DTYPES
from harness.store.fast_hash import BLOCK, fast_entry, stats_tolerance
from harness.store.tree import read_tree

pytestmark = pytest.mark.xdist_group("in_process_frameworks")

EXACT = ("min", "max", "nan", "inf")


def arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    normal = rng.standard_normal
    special = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 1e-40, 3.4e38, -2.5, np.nan], np.float32)
    with np.errstate(over="ignore"):  # 3.4e38 -> fp16 is inf
        return {
            "bf16 [7, 13]": normal((7, 13)).astype(ml_dtypes.bfloat16),
            "bf16 [2*BLOCK+1] (odd bytes)": normal(2 * BLOCK + 1).astype(ml_dtypes.bfloat16),
            "bf16 NaN/Inf/-0/subnormal": special.astype(ml_dtypes.bfloat16),
            "fp16 [3, 5] (odd bytes)": normal((3, 5)).astype(np.float16),
            "fp16 NaN/Inf/-0": special.astype(np.float16),
            "fp16 [] (0-d)": np.array(1.5, np.float16),
            "fp32 [BLOCK*2+37]": normal(BLOCK * 2 + 37).astype(np.float32),
            "fp32 NaN/Inf/-0/subnormal": special,
            "fp32 all NaN": np.full(5, np.nan, np.float32),
            "fp32 [0, 3] (empty)": np.zeros((0, 3), np.float32),
            "fp64 [3, BLOCK+1]": normal((3, BLOCK + 1)),
            "fp64 NaN/Inf/-0": special.astype(np.float64),
            "int32 with extremes": np.concatenate([rng.integers(-2**31, 2**31 - 1, 1000, np.int32),
                                                   np.array([-2**31, 2**31 - 1, 0, -1], np.int32)]),
            "int64 with extremes": np.concatenate([rng.integers(-2**63, 2**63 - 1, 999, np.int64),
                                                   np.array([-2**63, 2**63 - 1, 0, -1], np.int64)]),
            "int64 [] (0-d)": np.array(-3, np.int64),
            "bool [77] (odd bytes)": rng.random(77) > 0.5,
            "bool [0] (empty)": np.zeros(0, np.bool_),
        }


@pytest.fixture
def on_cpu(paddle):
    """Paddle's default device the CPU for the test (a CUDA build defaults to its GPU)."""
    before = paddle.get_device()
    paddle.set_device("cpu")
    yield paddle
    paddle.set_device(before)


def cpu_tensor(paddle, array: np.ndarray):
    """A CPU Paddle tensor with the array's bytes (bf16 from its uint16 bits)."""
    data = array.view(np.uint16) if array.dtype == ml_dtypes.bfloat16 else array
    return paddle.to_tensor(data, place=paddle.CPUPlace())


def digest_entry(handles_of, tensor) -> dict:
    """The dump entry of one digest started by `handles_of`, fetched by the Paddle adapter."""
    from harness.frameworks.paddle import PaddleAdapter

    pending = handles_of(tensor)
    pending.settle(PaddleAdapter().fetch_digests([pending.values])()[0])
    return pending.result()


def assert_same_entry(entry: dict, array: np.ndarray, label: str) -> None:
    """fast64, dtype and shape bitwise as numpy's; min, max and the counts exact, mean and norm within
    stats_tolerance (float64 sums in another order)."""
    expected = fast_entry(array)
    assert {k: entry[k] for k in ("fast64", "dtype", "shape")} == \
        {k: expected[k] for k in ("fast64", "dtype", "shape")}, label
    tolerance = stats_tolerance(expected["dtype"])
    for key, value in expected["stats"].items():
        got = entry["stats"][key]
        if value is None or key in EXACT:
            assert got == value or (isinstance(value, float) and math.isnan(value) and math.isnan(got)), (label, key)
        else:
            assert got == pytest.approx(value, rel=tolerance, abs=tolerance), (label, key)


def test_paddle_int64_arithmetic_wraps(on_cpu):
    """What the Paddle ops' S rests on: int64 multiply, add and sums (whole, along an axis) wrap mod 2**64 as
    numpy's do, and int32 -> int64 sign-extends."""
    paddle = on_cpu
    rng = np.random.default_rng(1)
    a, b = (rng.integers(-2**63, 2**63 - 1, size=(33, 4099), dtype=np.int64) for _ in range(2))
    pa, pb = cpu_tensor(paddle, a), cpu_tensor(paddle, b)
    with np.errstate(over="ignore"):
        product = a * b
        assert np.array_equal((pa * pb).numpy(), product) and np.array_equal((pa + pb).numpy(), a + b)
        assert np.array_equal((pa * pb).sum(axis=1).numpy(), product.sum(axis=1))
        assert int((pa * pb).sum()) == int(product.sum())
    words = np.array([-2**31, -1, 0, 2**31 - 1], np.int32)
    assert np.array_equal(cpu_tensor(paddle, words).cast(paddle.int64).numpy(), words.astype(np.int64))


def test_ops_digest_equals_numpy(on_cpu):
    from harness.frameworks import paddle_digest

    for label, array in arrays().items():
        assert_same_entry(digest_entry(paddle_digest.ops_digest, cpu_tensor(on_cpu, array)), array, label)


def test_ops_digest_of_views(on_cpu):
    """Slices whose memory starts 1 to 7 elements into another tensor's (Paddle's dtype views of those are
    misplaced: the digest copies them first), and non-contiguous views."""
    from harness.frameworks import paddle_digest

    rng = np.random.default_rng(2)
    for dtype in (np.float16, ml_dtypes.bfloat16, np.bool_, np.float32, np.int64):
        base = (rng.standard_normal(BLOCK + 41) * 3).astype(dtype)
        tensor = cpu_tensor(on_cpu, base)
        for start in (1, 2, 3, 7):
            assert_same_entry(digest_entry(paddle_digest.ops_digest, tensor[start:]), base[start:], f"{dtype} [{start}:]")
    matrix = rng.standard_normal((5, 9, 3)).astype(np.float32)
    tensor = cpu_tensor(on_cpu, matrix)
    assert_same_entry(digest_entry(paddle_digest.ops_digest, tensor.transpose([2, 0, 1])),
                      np.ascontiguousarray(matrix.transpose(2, 0, 1)), "transposed")
    assert_same_entry(digest_entry(paddle_digest.ops_digest, tensor[:, ::2]), np.ascontiguousarray(matrix[:, ::2]),
                      "strided")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(sorted(NUMPY_DTYPES)), size=st.integers(0, 300), start=st.integers(0, 3),
       seed=st.integers(0, 2**32 - 1))
def test_ops_digest_of_any_bytes(on_cpu, name, size, start, seed):
    """Any bit pattern (NaN payloads, subnormals, extremes) at any length and element offset."""
    from harness.frameworks import paddle_digest

    dtype = NUMPY_DTYPES[name]
    raw = np.random.default_rng(seed).integers(0, 256, size=(size + start) * dtype.itemsize, dtype=np.uint8)
    if name == "bool":
        raw &= 1  # a bool's byte is 0 or 1
    base = raw.view(dtype)
    tensor = cpu_tensor(on_cpu, base)[start:]
    assert_same_entry(digest_entry(paddle_digest.ops_digest, tensor), base[start:], f"{name} [{size}] at {start}")


def test_dlpack_route_on_cpu_equals_numpy(on_cpu, torch):
    """A Paddle tensor handed to torch by DLPack (no copy) and digested by torch's ops, as a CUDA tensor is
    before torch's fused kernel; here on the CPU, where torch runs its ops."""
    from harness.frameworks import paddle_digest

    for label, array in arrays().items():
        tensor = cpu_tensor(on_cpu, array)
        pending = paddle_digest.dlpack_digest(tensor)
        assert isinstance(pending.values, paddle_digest.TorchHandle), label  # the digest ran in torch
        assert_same_entry(digest_entry(paddle_digest.dlpack_digest, tensor), array, label)
    base = np.random.default_rng(3).standard_normal(41).astype(ml_dtypes.bfloat16)
    assert_same_entry(digest_entry(paddle_digest.dlpack_digest, cpu_tensor(on_cpu, base)[1:]), base[1:], "bf16 [1:]")


def test_one_fetch_for_both_kinds_of_handle(on_cpu, torch):
    """Paddle and torch handles mixed in one step's fetch come back in their order."""
    from harness.frameworks import paddle_digest
    from harness.frameworks.paddle import PaddleAdapter

    chosen = list(arrays().items())
    pending = [(paddle_digest.ops_digest if i % 2 else paddle_digest.dlpack_digest)(cpu_tensor(on_cpu, array))
               for i, (_, array) in enumerate(chosen)]
    rows = PaddleAdapter().fetch_digests([p.values for p in pending])()
    for (label, array), started, row in zip(chosen, pending, rows, strict=True):
        started.settle(row)
        assert_same_entry(started.result(), array, label)


def test_cpu_keeps_the_host_copy_and_unsupported_dtypes_are_refused(on_cpu, monkeypatch):
    """On the CPU a capture still hashes a host copy with numpy unless digest_on_cpu asks for the Paddle ops;
    no route takes a CPU tensor to torch; a dtype no dump holds is a ValueError naming it."""
    from harness.frameworks import paddle_digest
    from harness.frameworks.paddle import PaddleAdapter

    tensor = cpu_tensor(on_cpu, np.ones(3, np.float32))
    assert PaddleAdapter().device_digest(tensor) is None
    assert not paddle_digest.dlpack_route(tensor)
    monkeypatch.setattr(PaddleAdapter, "digest_on_cpu", True)
    assert PaddleAdapter().device_digest(tensor) is not None
    with pytest.raises(ValueError, match="unsupported dtype paddle.int16"):
        PaddleAdapter().device_digest(cpu_tensor(on_cpu, np.ones(3, np.int16)))


def test_cpu_tensors_at_hand_together_are_read_in_place(on_cpu):
    """device_digests of a step's CPU tensors: float32 and float64 ones contiguous and not empty digested in place
    together (fast_hash.host_digests), each entry numpy's of its host copy; the rest (a view, bf16, NaN) left to the
    capture's host copy (None), in the order given."""
    from harness.frameworks.paddle import PaddleAdapter

    paddle = on_cpu
    rng = np.random.default_rng(8)
    arrays = [rng.standard_normal((128, 64)).astype(np.float32), rng.standard_normal(3 * BLOCK + 1),
              rng.standard_normal((4, 6)).astype(np.float32), rng.standard_normal(5).astype(ml_dtypes.bfloat16),
              np.array([1.0, np.nan], np.float32), rng.standard_normal(1).astype(np.float32)]
    tensors = [cpu_tensor(paddle, array) for array in arrays]
    tensors[2] = tensors[2].T  # a view, not contiguous
    digests = PaddleAdapter().device_digests(tensors)
    assert [digest is not None for digest in digests] == [True, True, False, False, False, True]
    for i in (0, 1, 5):
        assert_same_entry(digests[i].result(), arrays[i], str(arrays[i].shape))


def test_capture_with_paddle_ops_matches_the_default(on_cpu, tmp_path, monkeypatch):
    """A small Paddle model's step captured with hash="fast" through the Paddle ops (one fetch at step())
    and through the default path (numpy on host copies): the same tensors, fast64s and statistics."""
    from harness.frameworks.paddle import PaddleAdapter

    paddle = on_cpu
    paddle.seed(0)
    model = paddle.nn.Sequential(paddle.nn.Linear(5, 7), paddle.nn.Tanh(), paddle.nn.Linear(7, 2))
    x = cpu_tensor(paddle, np.random.default_rng(4).standard_normal((3, 5)).astype(np.float32))
    x.stop_gradient = False

    def step(folder):
        with capture(model, folder, mode="digest", hash="fast") as cap:
            model(x).sum().backward()
            cap.step()
        model.clear_gradients()

    with monkeypatch.context() as patch:
        patch.setattr(PaddleAdapter, "digest_on_cpu", True)
        step(tmp_path / "ops")
    step(tmp_path / "default")
    ops, default = read_tree(tmp_path / "ops").step(0), read_tree(tmp_path / "default").step(0)
    assert ops.order == default.order and len(ops.unstored) > 10 and not ops.tensors
    assert {n: e["fast64"] for n, e in ops.unstored.items()} == {n: e["fast64"] for n, e in default.unstored.items()}
    for name, entry in ops.unstored.items():
        for key, value in default.unstored[name]["stats"].items():
            assert entry["stats"][key] == pytest.approx(value, rel=1e-12, abs=1e-12), (name, key)
    assert compare_trees(tmp_path / "ops", tmp_path / "default").passed


# -- on a GPU (a Paddle CUDA build) ---------------------------------------------------------------------------


@pytest.fixture
def paddle_gpu(paddle):
    if not paddle.device.is_compiled_with_cuda() or paddle.device.cuda.device_count() == 0:
        pytest.skip("needs Paddle with CUDA and a GPU (this paddlepaddle build is CPU only or sees none)")
    before = paddle.get_device()
    paddle.set_device("gpu")
    yield paddle
    paddle.set_device(before)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["auto", "paddle"])
def test_gpu_digests_equal_numpy(paddle_gpu, monkeypatch, kernel):
    """On the GPU, by the route the adapter picks (DLPack into torch's kernel where torch and triton are) and by
    Paddle ops (XFALIGN_FAST_DIGEST_KERNEL=paddle); an in-place change after the digest is not seen by it."""
    from harness.frameworks import paddle_digest
    from harness.frameworks.paddle import PaddleAdapter

    monkeypatch.setenv("XFALIGN_FAST_DIGEST_KERNEL", kernel)
    adapter = PaddleAdapter()
    for label, array in arrays().items():
        tensor = cpu_tensor(paddle_gpu, array).cuda()
        pending = adapter.device_digest(tensor)
        by_torch = isinstance(pending.values, paddle_digest.TorchHandle)
        assert by_torch == (kernel == "auto" and paddle_digest.dlpack_route(tensor)), label
        if array.size and array.dtype != np.bool_:
            tensor.fill_(0)  # queued after the digest on Paddle's stream
        pending.settle(adapter.fetch_digests([pending.values])()[0])
        assert_same_entry(pending.result(), array, label)


@pytest.mark.gpu
def test_gpu_capture_matches_the_cpu_default(paddle_gpu, tmp_path):
    """A GPU capture's parameters and inputs (the same bytes as on the CPU) have the CPU capture's fast64s."""
    paddle = paddle_gpu
    rng = np.random.default_rng(5)
    weights = [rng.standard_normal(shape).astype(np.float32) for shape in ((5, 7), (7,), (7, 2), (2,))]
    x = rng.standard_normal((3, 5)).astype(np.float32)
    entries = {}
    for device in ("gpu", "cpu"):
        paddle.set_device(device)
        model = paddle.nn.Sequential(paddle.nn.Linear(5, 7), paddle.nn.Tanh(), paddle.nn.Linear(7, 2))
        for param, value in zip(model.parameters(), weights, strict=True):
            param.set_value(paddle.to_tensor(value))
        with capture(model, tmp_path / device, mode="digest", hash="fast") as cap:
            model(paddle.to_tensor(x)).sum().backward()
            cap.step()
        entries[device] = read_tree(tmp_path / device).step(0).unstored
    same = [n for n in entries["cpu"] if ":param." in n or ":input." in n]
    assert same and all(entries["gpu"][n]["fast64"] == entries["cpu"][n]["fast64"] for n in same)

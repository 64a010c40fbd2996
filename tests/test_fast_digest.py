"""The fast digest (harness.store.fast_hash): numpy and torch give the same fast64, any one changed word
changes it; captures with hash="fast" of a torch module and of a Paddle layer agree on equal tensors; tree
comparisons of fast captures with full ones (the stored side hashed with numpy) and with MD5-only ones
(not comparable: said so)."""

import json

import ml_dtypes
import numpy as np
import pytest

from harness.capture import capture
from harness.capture.api import CaptureError
from harness.compare.pairs import DigestPair, originate
from harness.compare.tree import compare_trees
from harness.reports.text import finding_text, hash_text
from harness.store.digest import Digest
from harness.store.dump import Dump, DumpError
from harness.store.fast_hash import BLOCK, fast64
from harness.store.tree import read_tree

pytestmark = pytest.mark.xdist_group("in_process_frameworks")


def torch_fast64(torch, tensor) -> str:
    from harness.frameworks.torch import TorchAdapter, device_digest

    pending = device_digest(tensor)
    pending.settle(TorchAdapter().fetch_digests([pending.values])()[0])
    return pending.result()["fast64"]


def arrays(rng):
    """bf16, fp32, int32, bool, fp16, int64 of odd sizes, empty ones, and one over a block of words."""
    return {
        "bf16 odd": rng.standard_normal((7, 13)).astype(ml_dtypes.bfloat16),
        "fp32 > 1 block": rng.standard_normal(BLOCK * 2 + 37).astype(np.float32),
        "bf16 > 1 block, odd": rng.standard_normal(BLOCK * 2 + 1).astype(ml_dtypes.bfloat16),
        "int32": rng.integers(-2**31, 2**31 - 1, size=(3, 5, 11), dtype=np.int32),
        "int64": rng.integers(-2**62, 2**62, size=9, dtype=np.int64),
        "bool odd": rng.random(77) > 0.5,
        "fp16 scalar": np.array(1.5, dtype=np.float16),
        "fp32 empty": np.zeros((0, 3), np.float32),
        "bool empty": np.zeros(0, np.bool_),
    }


def test_numpy_and_torch_cpu_agree(torch):
    from harness.frameworks.torch import TorchAdapter

    adapter = TorchAdapter()
    for label, array in arrays(np.random.default_rng(0)).items():
        tensor = adapter.to_tensor(array, "cpu", False)
        assert torch_fast64(torch, tensor) == fast64(array), label
    # a view that does not start on a 4-byte boundary, and a transposed (non-contiguous) one
    base = np.random.default_rng(1).standard_normal(41).astype(ml_dtypes.bfloat16)
    tensor = adapter.to_tensor(base, "cpu", False)
    assert torch_fast64(torch, tensor[1:]) == fast64(base[1:])
    matrix = np.random.default_rng(2).standard_normal((5, 9)).astype(np.float32)
    assert torch_fast64(torch, adapter.to_tensor(matrix, "cpu", False).T) == fast64(np.ascontiguousarray(matrix.T))


def test_one_bit_in_any_word_changes_the_hash():
    rng = np.random.default_rng(3)
    array = rng.standard_normal(BLOCK + 5).astype(np.float32)  # words in two blocks, the last a tail
    reference = fast64(array)
    bits = array.view(np.uint32)
    for index in (0, 1, BLOCK - 1, BLOCK, BLOCK + 4, *rng.integers(0, array.size, 20)):
        for bit in (0, 17, 31):
            changed = bits.copy()
            changed[index] ^= np.uint32(1 << bit)
            assert fast64(changed.view(np.float32)) != reference, (index, bit)
    # the same bytes under another dtype or shape, and zero padding, differ too
    assert fast64(array.reshape(1, -1)) != reference
    assert fast64(bits.view(np.int32)) != reference
    odd = np.arange(3, dtype=np.int8).astype(np.bool_)
    assert fast64(odd) != fast64(np.append(odd, False))


def linears(torch, paddle):
    """A torch and a Paddle Linear with the same weights (torch [out, in], Paddle [in, out]) and bias."""
    rng = np.random.default_rng(4)
    weight, bias = rng.standard_normal((3, 6)).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    torch_linear = torch.nn.Linear(6, 3)
    with torch.no_grad():
        torch_linear.weight.copy_(torch.from_numpy(weight))
        torch_linear.bias.copy_(torch.from_numpy(bias))
    paddle_linear = paddle.nn.Linear(6, 3)
    paddle_linear.weight.set_value(paddle.to_tensor(weight.T.copy()))
    paddle_linear.bias.set_value(paddle.to_tensor(bias))
    return torch_linear, paddle_linear, rng.standard_normal((4, 6)).astype(np.float32)


def test_fast_captures_of_torch_and_paddle_agree(torch, paddle, tmp_path):
    torch_linear, paddle_linear, x = linears(torch, paddle)
    with capture(torch_linear, tmp_path / "torch", mode="digest", hash="fast") as cap:
        torch_linear(torch.from_numpy(x).requires_grad_()).sum().backward()
        cap.step()
    with capture(paddle_linear, tmp_path / "paddle", mode="digest", hash="fast") as cap:
        xp = paddle.to_tensor(x, stop_gradient=False)
        paddle_linear(xp).sum().backward()
        cap.step()
    a, b = read_tree(tmp_path / "torch").step(0), read_tree(tmp_path / "paddle").step(0)
    for dump in (a, b):
        assert not dump.tensors and all("md5" not in e and "xxh3" not in e for e in dump.unstored.values())
    for name in ("(root)#0:input.0", "(root):param.bias", "(root)#0:grad_output.0", "(root):grad.bias"):
        assert a.unstored[name]["fast64"] == b.unstored[name]["fast64"] == fast64(np.asarray(
            {"(root)#0:input.0": x, "(root):param.bias": torch_linear.bias.detach().numpy(),
             "(root)#0:grad_output.0": np.ones((4, 3), np.float32),
             "(root):grad.bias": np.full(3, 4.0, np.float32)}[name])), name
    assert a.unstored["(root):grad.bias"]["stats"] == {"min": 4.0, "max": 4.0, "mean": 4.0, "norm": 4 * 3 ** 0.5,
                                                       "nan": 0, "inf": 0}
    # the weights' layouts differ: Paddle's, transposed, has torch's bytes
    assert b.unstored["(root):param.weight"]["fast64"] == fast64(torch_linear.weight.detach().numpy().T.copy())
    assert "fast hash" in a.meta["provenance"]


def test_fast_against_full_and_md5_only(torch, tmp_path, monkeypatch):
    from harness.frameworks.torch import TorchAdapter

    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 2))
    x = torch.randn(3, 5, requires_grad=True)
    with monkeypatch.context() as patch:  # the GPU's path (torch ops, collected at step()), here on the CPU
        patch.setattr(TorchAdapter, "digest_on_cpu", True)
        with capture(model, tmp_path / "fast-torch-ops", mode="digest", hash="fast") as cap:
            model(x).sum().backward()
            cap.step()
        model.zero_grad()
    for name, mode, hash_ in (("fast", "digest", "fast"), ("full", "full", "md5"), ("md5", "digest", "md5")):
        with capture(model, tmp_path / name, mode=mode, hash=hash_) as cap:
            model(x).sum().backward()
            cap.step()
        model.zero_grad()
    assert compare_trees(tmp_path / "fast", tmp_path / "fast-torch-ops").passed
    fast, ops = read_tree(tmp_path / "fast").step(0), read_tree(tmp_path / "fast-torch-ops").step(0)
    assert fast.order == ops.order and {n: e["fast64"] for n, e in fast.unstored.items()} == \
        {n: e["fast64"] for n, e in ops.unstored.items()}
    for name, entry in ops.unstored.items():  # float64 sums in another order: the last bits may differ
        for key, value in fast.unstored[name]["stats"].items():
            assert entry["stats"][key] == pytest.approx(value, rel=1e-12, abs=1e-12), (name, key)
    for a, b in (("fast", "full"), ("full", "fast")):  # stored tensors hashed with numpy, either way round
        assert compare_trees(tmp_path / a, tmp_path / b).passed
    result = compare_trees(tmp_path / "md5", tmp_path / "fast")
    assert not result.passed and result.divergence is not None
    pair = result.divergence.tensor.pair
    assert isinstance(pair, DigestPair) and not pair.bitwise
    text = finding_text(result.divergence.tensor.findings[0])
    assert "not comparable" in text and "MD5 only" in text and "same hash" in text
    assert hash_text(pair.b).startswith("fast:") and hash_text(pair.a) == pair.a.md5[:8]


def test_fast_digest_differences_and_format(tmp_path):
    rng = np.random.default_rng(5)
    array = rng.standard_normal(10).astype(np.float32)
    changed = array.copy()
    changed[3] = np.nextafter(changed[3], np.float32(np.inf))
    fast = Digest("float32", (10,), None, fast64=fast64(array))
    pair = originate("t", changed, None, (Digest.of(changed), fast))  # stored side hashed with numpy
    assert isinstance(pair, DigestPair) and not pair.bitwise
    [finding] = pair.compare()
    assert finding.data.hash == "fast64" and "fast hash" in finding_text(finding)
    assert originate("t", array, None, (Digest.of(array), fast)).bitwise
    # a stored tensor always has an MD5; a digest-only one needs an MD5 or a fast64
    dump = Dump({"case": {}, "case_name": "c", "side": "s", "framework": "megatron", "impl": "x", "provenance": "p",
                 "environment": {}, "inputs": {}}, {"kept": array},
                unstored={"fast": {"dtype": "float32", "shape": [10], "fast64": fast.fast64}})
    folder = dump.write(tmp_path / "d")
    again = Dump.read(folder)
    assert again.digests["fast"] == fast and again.digests["kept"].md5 is not None
    meta = json.loads((folder / "meta.json").read_text())
    for entry in meta["tensors"]:
        entry.pop("md5", None)
    (folder / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(DumpError, match="md5"):
        Dump.read(folder)


def test_unknown_hash_is_refused(torch, tmp_path):
    with pytest.raises(CaptureError, match="unknown hash 'sha1'"):
        capture(torch.nn.Linear(2, 2), tmp_path / "t", mode="digest", hash="sha1")


def test_cpu_tensors_digested_together_are_digested_as_one_by_one(torch):
    """TorchAdapter.device_digests on the CPU (a step's parameters, gradients, optimizer states): float32 and
    float64 tensors contiguous and non-empty in one compiled call, the rest (views, bf16, ints, empty, NaN) alone;
    every entry as `device_digest` makes it (the sums but for their last bits), in the order given."""
    from harness.frameworks.torch import TorchAdapter

    torch.manual_seed(3)
    base = torch.randn(70_000, dtype=torch.float64)
    spoiled = torch.randn(5)
    spoiled[2] = float("nan")
    tensors = [torch.randn(128, 64), base, base[1:], torch.randn(8, 6).t(), torch.randn(9).to(torch.bfloat16),
               torch.arange(7), torch.empty(0), spoiled, torch.randn(1, dtype=torch.float64), torch.randn(3, 3)[1]]
    adapter = TorchAdapter()
    digests = adapter.device_digests(tensors)
    assert [digest.row is not None for digest in digests] == [True, True, True] + [False] * 5 + [True, True]  # batched
    together = [digest.result() for digest in digests]
    alone = [adapter.device_digest(tensor).result() for tensor in tensors]
    for found, expected, tensor in zip(together, alone, tensors, strict=True):
        label = (tensor.dtype, tuple(tensor.shape))
        assert {k: v for k, v in found.items() if k != "stats"} == {k: v for k, v in expected.items() if k != "stats"}, label
        for key, value in expected["stats"].items():
            assert found["stats"][key] == (value if value is None or key in ("min", "max", "nan", "inf") else
                                           pytest.approx(value, rel=1e-12)), (label, key)
    assert together[7]["stats"]["nan"] == 1

"""The digests shown and kept are digests of the data: a dump's and a golden's bytes are checked
against them on every read; and the mismatch heatmap comes out of the comparison's one pass."""

import json
import math
from concurrent.futures import ThreadPoolExecutor

import ml_dtypes
import numpy as np
import pytest

from harness.cli import main
from harness.compare import metrics
from harness.compare.case import compare_dumps
from harness.compare.heatmap import Grid
from harness.compare.metrics import element_stats_and_map, ulp_distance
from harness.store.digest import Digest, StreamCheck, digests_of, verify
from harness.store.dump import META_FILE, TENSORS_FILE, Dump, DumpError, IntegrityError, meta_text
from harness.store.golden import Golden

from report_fixtures import known_diff_dumps

BF16 = ml_dtypes.bfloat16


def write_dumps(tmp_path):
    """Two dumps as the worker writes them (no framework run): A and B."""
    a, b = known_diff_dumps()
    return a.write(tmp_path / "A"), b.write(tmp_path / "B")


def tensor_byte_offset(path, name: str) -> int:
    """Where tensor `name`'s bytes start in a safetensors file."""
    raw = path.read_bytes()
    header_length = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + header_length])
    return 8 + header_length + header[name]["data_offsets"][0]


def flip_byte(path, offset: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0x01
    path.write_bytes(bytes(raw))


def edit_meta(directory, change) -> None:
    meta = json.loads((directory / META_FILE).read_text())
    change(meta)
    (directory / META_FILE).write_text(json.dumps(meta))


def test_written_dump_records_md5_and_xxh3_and_reads_back(tmp_path):
    a_dir, _ = write_dumps(tmp_path)
    entries = json.loads((a_dir / META_FILE).read_text())["tensors"]
    assert all(len(e["md5"]) == 32 and len(e["xxh3"]) == 32 for e in entries)
    dump = Dump.read(a_dir)
    assert dump.digests == digests_of(dump.tensors)


def test_edited_tensor_byte_is_refused_by_name(tmp_path):
    a_dir, _ = write_dumps(tmp_path)
    flip_byte(a_dir / TENSORS_FILE, tensor_byte_offset(a_dir / TENSORS_FILE, "grad.x") + 7)
    with pytest.raises(IntegrityError) as error:
        Dump.read(a_dir)
    assert str(error.value) == (f"{a_dir}: tensor grad.x: bytes do not match the recorded MD5 and XXH3-128 "
                                "(corrupt or edited dump)")
    assert isinstance(error.value, DumpError)


def test_dump_without_xxh3_is_read_and_checked_by_md5(tmp_path):
    """Dumps written before XXH3 was recorded still read; their bytes are checked by MD5."""
    a_dir, _ = write_dumps(tmp_path)
    edit_meta(a_dir, lambda meta: [entry.pop("xxh3") for entry in meta["tensors"]])
    dump = Dump.read(a_dir)
    assert all(d.xxh3 is None for d in dump.digests.values())
    assert dump.digests == digests_of(dump.tensors)  # equality ignores the XXH3 one side lacks
    flip_byte(a_dir / TENSORS_FILE, tensor_byte_offset(a_dir / TENSORS_FILE, "out"))
    with pytest.raises(DumpError, match="tensor out: bytes do not match the recorded MD5 "):
        Dump.read(a_dir)


def test_recorded_dtype_or_shape_that_disagrees_is_refused(tmp_path):
    a_dir, _ = write_dumps(tmp_path)
    edit_meta(a_dir, lambda meta: meta["tensors"][0].update(shape=[1, *meta["tensors"][0]["shape"]]))
    name = json.loads((a_dir / META_FILE).read_text())["tensors"][0]["name"]
    with pytest.raises(DumpError) as error:
        Dump.read(a_dir)
    assert str(error.value) == (f"{a_dir}: tensor {name}: shape [64, 128] does not match the recorded [1, 64, 128] "
                                "(corrupt or edited dump)")
    edit_meta(a_dir, lambda meta: meta["tensors"][0].update(shape=[64, 128], dtype="float16"))
    with pytest.raises(DumpError, match=f"tensor {name}: dtype bfloat16 does not match the recorded float16 "):
        Dump.read(a_dir)


def test_meta_and_tensor_file_disagreement_is_named(tmp_path):
    a_dir, _ = write_dumps(tmp_path)
    edit_meta(a_dir, lambda meta: meta["tensors"].pop())  # grad.probs: in the file, not in meta
    with pytest.raises(DumpError) as error:
        Dump.read(a_dir)
    assert str(error.value) == f"{a_dir}: tensor grad.probs: in {TENSORS_FILE} but not listed in {META_FILE}"
    edit_meta(a_dir, lambda meta: meta["tensors"].append({"name": "grad.bias", "dtype": "float32", "shape": [4],
                                                          "md5": "0" * 32}))
    with pytest.raises(DumpError) as error:
        Dump.read(a_dir)
    assert str(error.value) == f"{a_dir}: tensor grad.bias: listed in {META_FILE} but not in {TENSORS_FILE}"


def test_cli_compare_of_an_edited_dump_exits_2_naming_the_tensor(tmp_path, capsys):
    a_dir, b_dir = write_dumps(tmp_path)
    assert main(["compare", str(a_dir), str(b_dir)]) == 1  # intact: compared (they differ)
    capsys.readouterr()
    flip_byte(b_dir / TENSORS_FILE, tensor_byte_offset(b_dir / TENSORS_FILE, "out") + 2)
    assert main(["compare", str(a_dir), str(b_dir)]) == 2
    assert (f"xfalign: error: {b_dir}: tensor out: bytes do not match the recorded MD5 and XXH3-128 (corrupt or "
            "edited dump)" in capsys.readouterr().err)


def test_comparison_checks_the_bytes_in_its_one_pass(tmp_path, monkeypatch):
    """Dumps read with check_bytes=False: the comparison's one pass, where it runs in several chunks,
    feeds every tensor's digest check (MD5, and XXH3 where the dump records it) chunk by chunk; pairs of
    one chunk are hashed together after the pass; a corrupt tensor is refused with the same error either
    way; a tensor that the pass does not scan (one side only) is still checked; the comparison of intact
    dumps is the one of dumps checked on read."""
    a_dir, b_dir = write_dumps(tmp_path)
    eager = compare_dumps(Dump.read(a_dir), Dump.read(b_dir))
    fed: list[int] = []
    original = StreamCheck.advance
    for chunk in (1024, metrics.CHUNK_ELEMENTS):  # "out" (8192 elements): in 8 chunks, then in one
        monkeypatch.setattr(metrics, "CHUNK_ELEMENTS", chunk)
        monkeypatch.setattr(StreamCheck, "advance", lambda self, stop: (fed.append(stop), original(self, stop))[1])
        lazy_a, lazy_b = Dump.read(a_dir, check_bytes=False), Dump.read(b_dir, check_bytes=False)
        fed.clear()
        lazy = compare_dumps(lazy_a, lazy_b)
        assert (1024 in fed) == (chunk == 1024)  # the element pass fed the checks, chunk by chunk
        assert [(r.name, r.findings) for r in lazy.tensors] == [(r.name, r.findings) for r in eager.tensors]
        assert [r.pair.values.stats for r in lazy.tensors] == [r.pair.values.stats for r in eager.tensors]
        assert not lazy_a.tensors._pending and not lazy_b.tensors._pending  # every tensor checked
        monkeypatch.undo()
    # B's tensor corrupt; then A's too: A's is named, as reading A then B would
    for side_dir, name, offset in ((b_dir, "out", 2), (a_dir, "grad.probs", 5)):
        flip_byte(side_dir / TENSORS_FILE, tensor_byte_offset(side_dir / TENSORS_FILE, name) + offset)
        with pytest.raises(IntegrityError) as error:
            compare_dumps(Dump.read(a_dir, check_bytes=False), Dump.read(b_dir, check_bytes=False))
        assert str(error.value) == (f"{side_dir}: tensor {name}: bytes do not match the recorded MD5 and XXH3-128 "
                                    "(corrupt or edited dump)")
    # old dumps (MD5 only) are checked by MD5 in the same pass
    edit_meta(a_dir, lambda meta: [entry.pop("xxh3") for entry in meta["tensors"]])
    with pytest.raises(IntegrityError, match="tensor grad.probs: bytes do not match the recorded MD5 "):
        compare_dumps(Dump.read(a_dir, check_bytes=False), Dump.read(b_dir, check_bytes=False))


def test_unchecked_tensors_are_checked_before_any_other_use(tmp_path):
    a_dir, _ = write_dumps(tmp_path)
    dump = Dump.read(a_dir, check_bytes=False)
    assert "out" in dump.tensors and list(dump.tensors) == ["out", "grad.x", "grad.probs"]
    assert dump.tensors["out"].shape == (64, 128)  # intact: handed out after its check
    flip_byte(a_dir / TENSORS_FILE, tensor_byte_offset(a_dir / TENSORS_FILE, "grad.x"))
    corrupt = Dump.read(a_dir, check_bytes=False)
    for use in (lambda t: t["grad.x"], lambda t: t.get("grad.x"), lambda t: dict(t.items()), lambda t: list(t.values())):
        with pytest.raises(IntegrityError, match="tensor grad.x: bytes do not match the recorded MD5 and XXH3-128 "):
            use(corrupt.tensors)
    assert corrupt.tensors["out"] is not None  # the others still read


def test_one_sided_and_unscannable_tensors_are_checked(tmp_path):
    a, b = known_diff_dumps()
    b.tensors = {"out": b.tensors["out"].reshape(-1)[:100].copy(), "grad.x": b.tensors["grad.x"]}
    a_dir, b_dir = a.write(tmp_path / "A"), b.write(tmp_path / "B")
    for name in ("grad.probs", "out"):  # only in A; shapes and sizes differ: not scanned
        flip_byte(a_dir / TENSORS_FILE, tensor_byte_offset(a_dir / TENSORS_FILE, name) + 1)
        with pytest.raises(IntegrityError, match=f"tensor {name}: bytes do not match"):
            compare_dumps(Dump.read(a_dir, check_bytes=False), Dump.read(b_dir, check_bytes=False))
        flip_byte(a_dir / TENSORS_FILE, tensor_byte_offset(a_dir / TENSORS_FILE, name) + 1)
    comparison = compare_dumps(Dump.read(a_dir, check_bytes=False), Dump.read(b_dir, check_bytes=False))
    assert [r.pair.__class__.__name__ for r in comparison.tensors] == ["MismatchedPair", "FloatPair", "OneSidedPair"]


def test_stream_check_fed_out_of_order_from_threads_matches_one_shot():
    rng = np.random.default_rng(7)
    array = rng.standard_normal(1 << 20).astype(np.float32)
    full = Digest.of(array)
    for digest in (full, Digest(full.dtype, full.shape, full.md5)):  # MD5 and XXH3; MD5 where no XXH3 is recorded
        check = StreamCheck(array, digest)
        stops = list(range(1000, array.size, 77_777))
        rng.shuffle(stops)
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(check.advance, stops))
        assert check.matches()
        edited = array.copy()
        edited[-1] += 1
        assert not StreamCheck(edited, digest).matches()
        assert not StreamCheck(array.reshape(2, -1), digest).matches()  # shape disagrees


def make_golden(tmp_path) -> tuple[Golden, object]:
    a, b = known_diff_dumps()
    golden = Golden("known_diff", {"x": Digest.of(np.zeros(3, np.float32))}, {"megatron": {}, "paddle": {}},
                    {d.side: digests_of(d.tensors) for d in (a, b)},
                    {f"{d.side}/{name}": array for d in (a, b) for name, array in d.tensors.items()})
    golden.write(tmp_path)
    return golden, Golden.paths(tmp_path, "known_diff")[1]


def test_golden_values_file_is_checked_on_read(tmp_path):
    golden, values = make_golden(tmp_path)
    read = Golden.read(tmp_path, "known_diff")
    assert read.tensors == golden.tensors and set(read.arrays) == set(golden.arrays)
    flip_byte(values, tensor_byte_offset(values, "paddle/grad.probs") + 4)
    with pytest.raises(DumpError) as error:  # a DumpError: the CLI answers it with exit 2
        Golden.read(tmp_path, "known_diff")
    assert str(error.value) == (f"{values}: tensor paddle/grad.probs: bytes do not match the golden's digest "
                                "(corrupt or edited golden)")


def test_golden_without_values_file_reads(tmp_path):
    golden, values = make_golden(tmp_path)
    golden.write(tmp_path, with_arrays=False)
    assert not values.exists()
    assert Golden.read(tmp_path, "known_diff").arrays is None


def test_digest_changes_with_any_byte_dtype_or_shape():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    d = Digest.of(a)
    for offset in (0, 17, a.nbytes - 1):
        edited = a.copy()
        edited.view(np.uint8).reshape(-1)[offset] ^= 0x80
        e = Digest.of(edited)
        assert e != d and e.md5 != d.md5 and e.xxh3 != d.xxh3
    assert Digest.of(a.view(np.int32)) != d  # same bytes, other dtype
    assert Digest.of(a.reshape(4, 3)) != d and Digest.of(a.reshape(-1)) != d  # same bytes, other shape
    assert Digest.of(a.copy()) == d and Digest(d.dtype, d.shape, d.md5) == d  # XXH3 is not part of ==
    assert verify({"t": a}, {"t": d}) == []
    assert verify({"t": a.reshape(4, 3)}, {"t": d}) == ["t"]
    assert verify({"t": a.view(np.int32)}, {"t": d}) == ["t"]
    assert verify({"t": a}, {"t": Digest(d.dtype, d.shape, d.md5)}) == []  # no XXH3 recorded: MD5
    assert verify({"t": a}, {"t": Digest(d.dtype, d.shape, "0" * 32)}) == ["t"]


def brute_force_map(a: np.ndarray, b: np.ndarray, shape: tuple) -> tuple[list, list]:
    """The heatmap as the former second scan computed it, element by element."""
    grid = Grid.of(shape)
    counts = np.zeros((grid.grid_rows, grid.grid_cols), dtype=np.int64)
    max_ulp = np.zeros_like(counts)
    ua = a.reshape(-1).view(np.uint16 if a.itemsize == 2 else np.uint32)
    ub = b.reshape(-1).view(ua.dtype)
    ulp = ulp_distance(a.reshape(-1), b.reshape(-1))
    finite = np.isfinite(a.reshape(-1).astype(np.float32)) & np.isfinite(b.reshape(-1).astype(np.float32))
    for i in np.flatnonzero(ua != ub):
        cell = (i // grid.cols // grid.row_step, i % grid.cols // grid.col_step)
        counts[cell] += 1
        if finite[i]:
            max_ulp[cell] = max(max_ulp[cell], ulp[i])
    return counts.tolist(), max_ulp.tolist()


@pytest.mark.parametrize("dtype", [np.float32, BF16])
@pytest.mark.parametrize("shape", [(1000,), (37, 129), (3, 5, 200), (300, 1), (130, 70)])
@pytest.mark.parametrize("fraction", [0.003, 0.3, 1.0])
def test_one_pass_heatmap_equals_brute_force(dtype, shape, fraction, monkeypatch):
    rng = np.random.default_rng(hash((shape, fraction)) % 2**32)
    a = (rng.standard_normal(shape) * 100).astype(dtype)
    b = a.copy()
    bits = b.reshape(-1).view(np.uint16 if b.itemsize == 2 else np.uint32)
    where = rng.choice(a.size, max(1, int(a.size * fraction)), replace=False)
    bits[where] += rng.integers(1, 50, where.size).astype(bits.dtype)
    b.reshape(-1)[where[:3]] *= -1  # sign flips: distances across zero
    b.reshape(-1)[where[3:4]] = np.nan  # a NaN mismatch: counted, with no ULP
    expected = brute_force_map(a, b, shape)
    whole_stats, whole = element_stats_and_map(a, b, shape)
    assert (whole.counts, whole.max_ulp) == expected
    # small chunks and blocks: cells cut across chunks, sparse and dense chunks side by side
    monkeypatch.setattr(metrics, "CHUNK_ELEMENTS", 256)
    monkeypatch.setattr(metrics, "DENSE_BLOCK", 64)
    stats, chunked = element_stats_and_map(a, b, shape, threads=2)
    assert (chunked.counts, chunked.max_ulp) == expected and stats == whole_stats
    assert sum(map(sum, chunked.counts)) == stats.differing


def test_no_map_when_nothing_differs():
    a = np.ones((8, 8), dtype=np.float32)
    stats, found = element_stats_and_map(a, a.copy(), a.shape)
    assert stats.bitwise_equal and found is None


# --- The MD5 shown is the MD5 of the bytes: a record whose MD5 (or XXH3) disagrees with them is refused ---

def tensor_digest(directory, name: str) -> Digest:
    """The digest of tensor `name`'s bytes as they are in the dump's file now."""
    from safetensors.numpy import load_file

    return Digest.of(load_file(directory / TENSORS_FILE)[name])


def set_entry(directory, name: str, **fields) -> None:
    edit_meta(directory, lambda meta: next(e for e in meta["tensors"] if e["name"] == name).update(fields))


def md5_of_other_side(directory, other, name):
    """A's MD5 of `name` replaced by B's (A's bytes left as they are)."""
    set_entry(directory, name, md5=tensor_digest(other, name).md5)


def md5_zeroed(directory, other, name):
    set_entry(directory, name, md5="0" * 32)


def bit_flipped_xxh3_rerecorded(directory, other, name):
    """A bit of the tensor flipped and its XXH3 recorded again from the edited bytes; the MD5 left stale."""
    flip_byte(directory / TENSORS_FILE, tensor_byte_offset(directory / TENSORS_FILE, name) + 3)
    set_entry(directory, name, xxh3=tensor_digest(directory, name).xxh3)


def xxh3_zeroed(directory, other, name):
    """The XXH3 edited, the MD5 left right: still an edited record."""
    set_entry(directory, name, xxh3="0" * 32)


MD5_EDITS = [md5_of_other_side, md5_zeroed, bit_flipped_xxh3_rerecorded]


def refusal(directory, name: str, hash_name: str) -> str:
    return f"xfalign: error: {directory}: tensor {name}: bytes do not match the recorded {hash_name} (corrupt or edited dump)"


@pytest.mark.parametrize("edit, hash_name", [(e, "MD5") for e in MD5_EDITS] + [(xxh3_zeroed, "XXH3-128")])
def test_cli_compare_refuses_a_dump_whose_recorded_hash_disagrees(tmp_path, capsys, edit, hash_name):
    """The three edits of the issue (and an edited XXH3), each on A's `out`: exit 2 naming the tensor and the
    hash, nothing written (no table, JSON or HTML shows the edited digest)."""
    a_dir, b_dir = write_dumps(tmp_path)
    edit(a_dir, b_dir, "out")
    outputs = ["--json", str(tmp_path / "r.json"), "--html", str(tmp_path / "r.html")]
    assert main(["compare", str(a_dir), str(b_dir), *outputs]) == 2
    captured = capsys.readouterr()
    assert refusal(a_dir, "out", hash_name) in captured.err
    assert "out" not in captured.out and not (tmp_path / "r.json").exists() and not (tmp_path / "r.html").exists()
    with pytest.raises(IntegrityError, match=f"tensor out: bytes do not match the recorded {hash_name} "):
        Dump.read(a_dir)  # read on its own (checked all at once) as well


def test_an_old_dump_without_xxh3_is_still_checked_by_md5(tmp_path, capsys):
    a_dir, b_dir = write_dumps(tmp_path)
    edit_meta(a_dir, lambda meta: [entry.pop("xxh3") for entry in meta["tensors"]])
    assert main(["compare", str(a_dir), str(b_dir)]) == 1  # intact: compared
    capsys.readouterr()
    md5_of_other_side(a_dir, b_dir, "out")
    assert main(["compare", str(a_dir), str(b_dir)]) == 2
    assert refusal(a_dir, "out", "MD5") in capsys.readouterr().err


def write_full_tree(path, side: str, tweak=None):
    """A capture tree (full mode, two steps) of a small torch model, as harness.capture writes it."""
    import torch

    from harness.capture import capture

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    if tweak is not None:
        with torch.no_grad():
            tweak(model)
    with capture(model, path, mode="full", side=side) as cap:
        for _ in range(2):
            model(torch.ones(3, 8)).sum().backward()
            cap.step()
            model.zero_grad()
    return path


@pytest.mark.xdist_group("in_process_frameworks")
@pytest.mark.parametrize("edit, hash_name", [(e, "MD5") for e in MD5_EDITS] + [(xxh3_zeroed, "XXH3-128")])
def test_cli_compare_refuses_a_capture_step_whose_recorded_hash_disagrees(tmp_path, capsys, torch, edit, hash_name):
    """The same edits on one step of a capture tree (full mode): `xfalign compare TREE_A TREE_B` exits 2 naming
    the step's folder and the tensor."""
    tree_a = write_full_tree(tmp_path / "a", "megatron")
    tree_b = write_full_tree(tmp_path / "b", "paddle", tweak=lambda model: model[1].bias.add_(1.0))
    assert main(["compare", str(tree_a), str(tree_b), "--html", str(tmp_path / "intact.html")]) == 1  # they differ
    capsys.readouterr()
    step, name = tree_a / "step-00001", "1#0:output.0"
    assert tensor_digest(step, name) != tensor_digest(tree_b / "step-00001", name)
    edit(step, tree_b / "step-00001", name)
    assert main(["compare", str(tree_a), str(tree_b), "--html", str(tmp_path / "r.html")]) == 2
    assert refusal(step, name, hash_name) in capsys.readouterr().err
    assert not (tmp_path / "r.html").exists()


def test_verify_and_stream_check_refuse_a_stale_md5():
    """Bytes edited and the XXH3 recorded again, the MD5 left stale: neither the all-at-once check nor the
    streaming one accepts it, and both say it is the MD5 that disagrees."""
    from harness.store.digest import mismatches

    rng = np.random.default_rng(3)
    array = rng.standard_normal(1 << 19).astype(np.float32)
    recorded = Digest.of(array)
    edited = array.copy()
    edited.view(np.uint32)[12345] ^= 1
    stale = Digest(recorded.dtype, recorded.shape, recorded.md5, Digest.of(edited).xxh3)
    assert verify({"t": array}, {"t": recorded}) == [] and verify({"t": edited}, {"t": stale}) == ["t"]
    disagree = "bytes do not match the recorded "
    assert mismatches({"t": edited}, {"t": stale}) == {"t": disagree + "MD5"}
    xxh3_only = Digest(recorded.dtype, recorded.shape, recorded.md5, "0" * 32)
    assert mismatches({"t": array}, {"t": xxh3_only}) == {"t": disagree + "XXH3-128"}
    both = Digest(recorded.dtype, recorded.shape, "0" * 32, "0" * 32)
    assert mismatches({"t": array, "u": edited}, {"t": both, "u": recorded}) == {"t": disagree + "MD5 and XXH3-128",
                                                                                  "u": disagree + "MD5 and XXH3-128"}
    from harness.store.fast_hash import fast64

    with_fast64 = Digest(recorded.dtype, recorded.shape, recorded.md5, recorded.xxh3, fast64(array))
    assert mismatches({"t": array}, {"t": with_fast64}) == {}  # a fast64 recorded beside them is checked too
    assert verify({"t": array}, {"t": Digest(recorded.dtype, recorded.shape, recorded.md5, fast64="0" * 16)}) == ["t"]
    for digest, data, expected in ((stale, edited, disagree + "MD5"), (xxh3_only, array, disagree + "XXH3-128"),
                                   (recorded, array, None)):
        check = StreamCheck(data, digest)
        stops = list(range(1000, data.size, 33_333))
        with ThreadPoolExecutor(2) as pool:  # fed from threads, as the comparison's pass feeds it
            list(pool.map(check.advance, stops))
        assert check.mismatch() == expected and check.matches() == (expected is None)
    # a digest-only record (no bytes) is not verified: there is nothing to verify it against
    assert verify({}, {"t": stale}) == []


def test_meta_text_keeps_every_value_json_can_hold():
    """meta.json is written by orjson, which writes NaN and Inf as null and refuses integers past 64 bits: those
    lines are written by json, so every value reads back as it was, a None as null."""
    meta = {"tensors": [{"name": "a", "stats": {"mean": float("nan"), "norm": float("inf"), "min": None}},
                        {"name": "b", "stats": {"mean": -float("inf"), "norm": 1.5e-300, "min": -0.0}},
                        {"name": "c", "big": 2**70, "small": -(2**63), "text": "ü\n\"x\""}],
            "notes": None, "world": 3, "nested": {"records": [{"call": None, "n": 1e-05}]}}
    text = meta_text(meta)
    found = json.loads(text)
    assert math.isnan(found["tensors"][0]["stats"]["mean"]) and found["tensors"][0]["stats"]["norm"] == math.inf
    found["tensors"][0]["stats"]["mean"] = meta["tensors"][0]["stats"]["mean"] = 0.0
    assert found == meta
    assert math.copysign(1.0, found["tensors"][1]["stats"]["min"]) == -1.0
    assert sum(line.lstrip().startswith('{"') for line in text.splitlines()) == 4  # a line per item of a list of objects


def test_meta_text_lines_from_one_call_are_each_items_own():
    """A list's objects are written by one orjson call and split where they meet: an object whose text holds that
    seam (a name, a nested list of objects) or a NaN beside a null makes no line of another's."""
    items = [{"name": "a},{b", "n": 1}, {"inner": [{"x": 1}, {"y": None}]}, {"call": None, "v": float("nan")},
             {"call": None, "v": 2.5}, {}]
    for listed in (items, items[2:], items[3:]):
        text = meta_text({"records": listed})
        found = json.loads(text)["records"]
        assert len(found) == len(listed) and all(
            f == e or (math.isnan(f["v"]) and math.isnan(e["v"])) for f, e in zip(found, listed))
        assert sum(line.lstrip().startswith("{") for line in text.splitlines()[1:]) == len(listed)

"""Sharding: a rank's piece and the canonical tensor put back from every rank's piece (harness/sharding.py)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.sharding import Sharding, ShardingError


@settings(max_examples=100, deadline=None)
@given(world=st.sampled_from([1, 2, 4]), interleave=st.integers(1, 3), ndim=st.integers(1, 3),
       data=st.data())
def test_pieces_of_every_rank_assemble_to_the_canonical_tensor(world, interleave, ndim, data):
    axis = data.draw(st.integers(-ndim, ndim - 1))
    shape = [data.draw(st.integers(1, 3)) for _ in range(ndim)]
    shape[axis] *= world * interleave
    canonical = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    sharding = Sharding(axis=axis, interleave=interleave)
    pieces = [sharding.shard(canonical, r, world) for r in range(world)]
    assert all(p.shape[axis] == canonical.shape[axis] // world for p in pieces)
    assembled, differ = sharding.assemble(pieces)
    assert differ == []
    assert assembled.tobytes() == canonical.tobytes() and assembled.shape == canonical.shape


def test_gated_fc1_weight_holds_gate_and_up_blocks_of_each_rank():
    """Megatron's gated linear_fc1 at TP=2: rank r holds [gate_r; up_r]; canonical is [gate; up]."""
    gate = np.arange(4)[:, None] * np.ones((1, 3))  # rows 0..3
    up = 10 + np.arange(4)[:, None] * np.ones((1, 3))  # rows 10..13
    canonical = np.concatenate([gate, up])
    sharding = Sharding(axis=0, interleave=2)
    rank1 = sharding.shard(canonical, 1, 2)
    assert rank1[:, 0].tolist() == [2, 3, 12, 13]  # [gate_1; up_1]
    assert Sharding(axis=0).assemble([sharding.shard(canonical, r, 2) for r in range(2)])[0][:, 0].tolist() != \
        canonical[:, 0].tolist()  # plain concatenation of the ranks' pieces is not the canonical weight


def test_replicas_that_differ_are_named_by_rank():
    a = np.array([1.0, 2.0], dtype=np.float32)
    b = a.copy()
    b[1] = np.nextafter(b[1], np.float32(3))
    whole, differ = Sharding().assemble([a, a.copy(), b])
    assert differ == [2] and whole.tobytes() == a.tobytes()
    assert Sharding().assemble([a, a.copy()])[1] == []
    negative_zero = np.array([-0.0], dtype=np.float32)
    assert Sharding().assemble([np.array([0.0], dtype=np.float32), negative_zero])[1] == [1]  # bits, not values


def test_pieces_that_do_not_line_up_are_refused():
    with pytest.raises(ShardingError, match="rank 1"):
        Sharding(axis=0).assemble([np.zeros((2, 3)), np.zeros((2, 4))])
    with pytest.raises(ShardingError, match="does not split"):
        Sharding(axis=1).shard(np.zeros((2, 3)), 0, 2)
    with pytest.raises(ShardingError, match="no rank"):
        Sharding(axis=0).assemble([])
    with pytest.raises(ValueError):
        Sharding(axis=None, interleave=2)


def test_ragged_pieces_are_joined_in_rank_order_whatever_their_lengths():
    """The tokens each rank's experts received: as many as the routing sent, joined in rank order."""
    pieces = [np.arange(6, dtype=np.float32).reshape(3, 2), np.arange(6, 10, dtype=np.float32).reshape(2, 2)]
    whole, differ = Sharding(axis=0, ragged=True).assemble(pieces)
    assert differ == [] and whole.tolist() == np.arange(10).reshape(5, 2).tolist()
    with pytest.raises(ShardingError, match="rank 1"):
        Sharding(axis=0, ragged=True).assemble([np.zeros((3, 2)), np.zeros((2, 3))])
    with pytest.raises(ShardingError, match="cannot be cut"):
        Sharding(axis=0, ragged=True).shard(np.zeros((4, 2)), 0, 2)


@settings(max_examples=50, deadline=None)
@given(world=st.integers(2, 4), seed=st.integers(0, 2**16), dtype=st.sampled_from([np.float32, np.float64]))
def test_partial_sums_add_up_in_rank_order_in_their_dtype(world, seed, dtype):
    pieces = [np.random.default_rng(seed + r).standard_normal((3, 4)).astype(dtype) for r in range(world)]
    whole, differ = Sharding(reduce="sum").assemble(pieces)
    expected = pieces[0]
    for piece in pieces[1:]:
        expected = expected + piece
    assert differ == [] and whole.dtype == dtype and whole.tobytes() == expected.tobytes()
    with pytest.raises(ShardingError, match="partial sum"):
        Sharding(reduce="sum").assemble([pieces[0], pieces[1][:2]])


def test_renamed_pieces_are_not_one_tensor_and_kinds_do_not_mix():
    sharding = Sharding(rename=lambda rank: f"experts.{2 * rank}:param.weight")
    assert not sharding.replicated and "renamed" in sharding.describe()
    with pytest.raises(ShardingError, match="renamed"):
        sharding.assemble([np.zeros(2), np.zeros(2)])
    with pytest.raises(ShardingError, match="cannot be cut"):
        Sharding(reduce="sum").shard(np.zeros(2), 1, 2)
    for bad in (dict(axis=0, reduce="sum"), dict(ragged=True), dict(axis=0, ragged=True, interleave=2),
                dict(reduce="sum", rename=str)):
        with pytest.raises(ValueError):
            Sharding(**bad)

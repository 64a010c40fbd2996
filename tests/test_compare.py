"""Pairing: structural differences are findings, never crashes."""

import ml_dtypes
import numpy as np

from harness.case import MaxUlp
from harness.compare import failure_text, pair_tensors


def test_shape_n_vs_n1_is_a_finding_and_values_still_compared():
    a = np.arange(8, dtype=np.float32)
    pair = pair_tensors("grad.probs", a, a.reshape(8, 1), "bitwise")
    assert pair.findings == ["shape differs: [8] vs [8, 1]; values compared flattened"]
    assert pair.stats.bitwise_equal and not pair.bitwise and not pair.holds
    assert "shape differs" in failure_text(pair)


def test_dtype_and_missing_are_findings():
    a = np.ones(4, dtype=np.float32)
    pair = pair_tensors("x", a, a.astype(ml_dtypes.bfloat16), MaxUlp(max_ulp=4))
    assert pair.findings == ["dtype differs: float32 vs bfloat16"] and pair.stats is None and not pair.holds
    missing = pair_tensors("grad.bias", a, None, "report")
    assert missing.findings == ["missing on side B"] and missing.holds


def test_max_ulp_expectation_boundaries():
    a = np.ones(4, dtype=np.float32)
    b = a.copy()
    b.view(np.uint32)[2] += 3
    assert pair_tensors("t", a, b, MaxUlp(max_ulp=3)).holds
    assert not pair_tensors("t", a, b, MaxUlp(max_ulp=2)).holds
    b[0] = np.nan
    assert not pair_tensors("t", a, b, MaxUlp(max_ulp=100)).holds  # a NaN mismatch is never within ULPs
    text = failure_text(pair_tensors("t", a, b, MaxUlp(max_ulp=2)))
    assert "2 of 4 elements differ" in text and "1 NaN" in text

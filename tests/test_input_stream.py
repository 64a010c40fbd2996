"""Input bits are pinned: numpy's generator stream, and every input of every built-in case, against digests
recorded once. numpy promises no stream across versions (NEP 19): if one of these fails after an upgrade, the
inputs changed, and so would every golden.

When a change to the inputs is intended (a new or edited case): `python3 scripts/input_digests.py --write
tests/data/input_digests.json`; when existing inputs' bits change, bump harness.store.dump.GENERATOR as well.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from pathlib import Path

import numpy as np
import pytest
from scripts_loader import load_script

ROOT = Path(__file__).resolve().parent.parent
DIGESTS = ROOT / "tests" / "data" / "input_digests.json"

# The generator's calls, in this order on one `default_rng([seed, crc32(input name)])` (harness.inputs):
# draws, integer draws, the positions and values of planted special values (both choice regimes: a
# sample of few of many, and a permutation), and the random keys the MoE family sorts for its routing.
DRAWS = {
    "normal": lambda rng: rng.normal(0.5, 2.0, size=1000),
    "uniform": lambda rng: rng.uniform(-3.0, 7.0, size=1000),
    "integers": lambda rng: rng.integers(-5, 1 << 40, size=1000, dtype=np.int64),
    "choice sample": lambda rng: rng.choice(100_000, size=1000, replace=False),
    "choice values": lambda rng: rng.choice(np.array([7.0, -7.0, 0.25]), size=1000),
    "random": lambda rng: rng.random((10, 100)),
    "choice permutation": lambda rng: rng.choice(1000, size=900, replace=False),
}
# Recorded with numpy 2.4.6; the same stream is expected of every numpy.
KNOWN = {
    (0, "x"): {
        "normal": "935f414a270a3d03aae8cdf5af31541e", "uniform": "c60f3cb39b21208eae983fde3ab14caf",
        "integers": "8d5030b37f79bf39c132ebbebe6d3551", "choice sample": "90cdf7d7bd2f26124798a33e452c2918",
        "choice values": "132704d2aebbfe6046731498e51bbc27", "random": "268654cf98de5803991954c4a3965628",
        "choice permutation": "cf5f2f68ea93204b9677ebc3670530f7",
    },
    (1234, "grad_out"): {
        "normal": "ba1f166a6350b542e90e60a244a34b08", "uniform": "4928dce3ee1fb8dfaf6b5dff44620781",
        "integers": "0c93e4a144533b1eeb0539c676390e42", "choice sample": "e14fdf9ca024bae2cb6e3e2a94860eb7",
        "choice values": "9c2ad52e56657cf059e91024bfe44f3a", "random": "396b015202f09d2fca3fee171f752195",
        "choice permutation": "5bf8afd59c9cced86ccf073469df719d",
    },
    (2**31 + 5, "weight"): {
        "normal": "f82d5988070c58699f43d5af5b727bd0", "uniform": "b216c495c1ba33bcaf5db9435ffdc760",
        "integers": "489b23489732091813d563fdedc05ff2", "choice sample": "ff9b61d4106aa65678be904042f1208c",
        "choice values": "30c787578f928ec90510d274e9808231", "random": "8b28fd74cb951b851e6e611e7215619d",
        "choice permutation": "28819382254e4425cef1b40a59e7375b",
    },
}


def stream_digests(seed: int, name: str) -> dict[str, str]:
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    digests = {}
    for draw, make in DRAWS.items():
        values = make(rng)
        digests[draw] = hashlib.md5(values.astype(values.dtype.newbyteorder("<")).tobytes()).hexdigest()
    return digests


@pytest.mark.parametrize("seed, name", list(KNOWN))
def test_numpy_generator_stream_is_the_recorded_one(seed, name):
    assert stream_digests(seed, name) == KNOWN[seed, name], f"numpy {np.__version__}: the generator's stream changed"


def test_every_builtin_input_has_its_recorded_digest():
    script = load_script("input_digests")
    files = script.case_files()
    assert any(f.parent.name == "gpu" for f in files) and len(files) > 30
    actual = script.input_digests(files)
    different = script.differences(json.loads(DIGESTS.read_text()), actual)
    assert not different, ("inputs differ from tests/data/input_digests.json (if intended: scripts/input_digests.py "
                           "--write it, and bump harness.store.dump.GENERATOR if existing inputs changed):\n" + "\n".join(different))


def test_digest_file_is_as_the_script_writes_it():
    script = load_script("input_digests")
    text = DIGESTS.read_text()
    assert script.dumps(json.loads(text)) == text  # sorted, one line per input: a change reads well in a diff

"""bf16 and fp8 arrays through .npz files: coco-run --inputs reads and --output writes the
documented encoding (uint16 / uint8 bits named in `__coconet_dtypes__`), refuses NumPy's raw
'V2' / 'V1' records with a
message saying what to do, and never leaves a half-written output file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from coconet.core.program import CocoError
from coconet.core.values import NPZ_DTYPES_KEY, load_arrays, save_arrays

ROOT = Path(__file__).resolve().parents[2]


def test_bf16_round_trips_bit_for_bit(tmp_path):
    x = np.array([1.5, -0.0, np.inf, np.nan, 3.0e-39], dtype=ml_dtypes.bfloat16)
    y = np.arange(4, dtype=np.float32)
    save_arrays(str(tmp_path / "a.npz"), {"x": x, "y": y})
    with np.load(tmp_path / "a.npz") as raw:  # what other tools see: plain uint16 + a map
        assert raw["x"].dtype == np.uint16
        assert json.loads(str(raw[NPZ_DTYPES_KEY])) == {"x": "bf16"}
    back = load_arrays(str(tmp_path / "a.npz"))
    assert back["x"].dtype == ml_dtypes.bfloat16
    assert back["x"].view(np.uint16).tolist() == x.view(np.uint16).tolist()
    assert np.array_equal(back["y"], y)


@pytest.mark.parametrize(
    ("elt", "dtype"),
    [("f8E4M3FN", ml_dtypes.float8_e4m3fn), ("f8E5M2", ml_dtypes.float8_e5m2)],
)
def test_fp8_round_trips_bit_for_bit(tmp_path, elt, dtype):
    every = np.arange(256, dtype=np.uint8).view(dtype)  # every code, NaNs and infinities too
    save_arrays(str(tmp_path / "a.npz"), {"q": every})
    with np.load(tmp_path / "a.npz") as raw:
        assert raw["q"].dtype == np.uint8
        assert json.loads(str(raw[NPZ_DTYPES_KEY])) == {"q": elt}
    back = load_arrays(str(tmp_path / "a.npz"))
    assert back["q"].dtype == dtype
    assert back["q"].view(np.uint8).tolist() == list(range(256))


def test_a_mark_that_does_not_fit_the_bits_is_refused(tmp_path):
    np.savez(
        tmp_path / "bad.npz",
        q=np.zeros(3, np.uint16),
        __coconet_dtypes__=np.array('{"q": "f8E4M3FN"}'),
    )
    with pytest.raises(CocoError, match="marked f8E4M3FN but holds uint16, not uint8 bits"):
        load_arrays(str(tmp_path / "bad.npz"))


@pytest.mark.parametrize(
    ("dtype", "size", "bits"),
    [(ml_dtypes.bfloat16, 2, "uint16"), (ml_dtypes.float8_e5m2, 1, "uint8")],
)
def test_numpys_raw_records_are_refused_with_the_way_out(tmp_path, dtype, size, bits):
    np.savez(tmp_path / "raw.npz", g=np.ones(3, dtype=dtype))
    what = f"raw {size}-byte records" if size == 2 else "how NumPy saves fp8"
    with pytest.raises(CocoError, match=f"{what}.*{bits} for"):
        load_arrays(str(tmp_path / "raw.npz"))


def test_output_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    target = tmp_path / "out.npz"
    target.write_bytes(b"previous")

    def broken(f, **arrays):
        f.write(b"half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(np, "savez", broken)
    with pytest.raises(CocoError, match="No space left"):
        save_arrays(str(target), {"x": np.ones(3)})
    assert target.read_bytes() == b"previous"
    assert [p.name for p in tmp_path.iterdir()] == ["out.npz"]
    (tmp_path / "dir.npz").mkdir()
    with pytest.raises(CocoError, match="Is a directory"):
        save_arrays(str(tmp_path / "dir.npz"), {"x": np.ones(3)})
    # A directory without the suffix is refused too, not written beside as `dir.npz`.
    (tmp_path / "outdir").mkdir()
    with pytest.raises(CocoError, match="Is a directory"):
        save_arrays(str(tmp_path / "outdir"), {"x": np.ones(3)})
    assert not (tmp_path / "outdir.npz").exists()


def test_save_arrays_returns_the_file_it_wrote(tmp_path):
    assert save_arrays(str(tmp_path / "named"), {"x": np.ones(3)}) == str(tmp_path / "named.npz")
    assert (tmp_path / "named.npz").is_file()


@pytest.mark.parametrize("backend", ["sim", "cpu"])
def test_coco_run_takes_and_gives_bf16(tmp_path, backend):
    rng = np.random.default_rng(0)
    g = rng.standard_normal((2, 4096)).astype(ml_dtypes.bfloat16)  # local: one per rank
    inputs = {
        "g": g,
        "w": np.ones(4096, np.float32),
        "m": np.zeros(4096, np.float32),
        "v": np.zeros(4096, np.float32),
        "lr": np.float32(0.1),
        "beta1": np.float32(0.9),
        "beta2": np.float32(0.99),
        "eps": np.float32(1e-8),
        "step": np.float32(1.0),
    }
    save_arrays(str(tmp_path / "in.npz"), inputs)
    out = tmp_path / "out.npz"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "coconet.tools.coco_run",
            "examples/adam_bf16_grads.mlir",
            "--np",
            "2",
            "--backend",
            backend,
            "--inputs",
            str(tmp_path / "in.npz"),
            "--output",
            str(out),
            "-q",
        ],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    w = load_arrays(str(out))["w"]
    # first Adam step: w moves by lr against the sign of the summed gradient
    total = g.astype(np.float32).sum(axis=0)
    assert np.allclose(w, 1.0 - 0.1 * np.sign(total), atol=1e-4)

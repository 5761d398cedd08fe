"""coco-bench under torchrun: each torchrun process is one rank of the sweep (no mpiexec), rank
0 alone prints the rows and writes the JSON rows and the trace."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

torch = pytest.importorskip("torch", reason="the test extra installs torch")


def _env() -> dict[str, str]:
    # A torchrun launched from inside an MPI job (or another torchrun) must not inherit it.
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PMI_", "OMPI_", "MPI_", "HYDRA_", "RANK", "WORLD_SIZE"))
    }


def test_coco_bench_under_torchrun(tmp_path):
    rows_file, trace = tmp_path / "rows.json", tmp_path / "trace.json"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
        + ["-m", "coconet.tools.coco_bench", "--op", "all_reduce", "-b", "1K", "-e", "2K"]
        + ["--backend", "cpu", "-n", "2", "-w", "1", "--schedule", "ar-c"]
        + ["--schedule", "fuse(rs-c-ag)", "--json", str(rows_file), "--trace", str(trace)],
        check=False,
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("# coco-bench: all_reduce (f32) on 2 rank(s)") == 1  # rank 0 only
    rows = json.loads(rows_file.read_text())["rows"]
    assert [(r["size_bytes"], r["schedule"]) for r in rows] == [
        (1024, "ar-c"),
        (1024, "fuse(rs-c-ag)"),
        (2048, "ar-c"),
        (2048, "fuse(rs-c-ag)"),
    ]
    assert all(r["ranks"] == 2 and r["busbw_factor"] == pytest.approx(1.0) for r in rows)
    steps = [e for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X"]
    assert {e["pid"] for e in steps} == {0, 1}

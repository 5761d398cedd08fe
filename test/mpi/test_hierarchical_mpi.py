"""Fused collectives across nodes, on real MPI ranks (the mpich wheel's mpiexec).

COCONET_RANKS_PER_NODE=2 makes 4 ranks of this machine two "nodes" of 2: the plan puts a fused
collective's intra-node part in kernels over symmetric memory (MPI shared-memory windows among
each declared node only) and its inter-node part in MPI collectives. Each job checks every
rank's outputs against the sim oracle and that the plan it ran is the hierarchical one."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from mpi_env import MPI_MARKS, MPIEXEC

ROOT = Path(__file__).resolve().parents[2]

pytestmark = MPI_MARKS

# One job runs several examples: each compiled for the job's nodes, run on each rank's piece,
# and compared with the sim oracle (bit-exact where it can be: the node partials are combined
# in double and rounded once; otherwise within the per-dtype tolerance).
SCRIPT = textwrap.dedent(
    """
    import sys
    import numpy as np
    import coconet
    from coconet.compile import apply_schedule, compile
    from coconet.lowering.plan import Collective, Launch, PeerTable
    from coconet.core import values as V
    from coconet.runtime import sim
    from coconet.runtime.check import compare_outputs
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    want_nodes = tuple(int(n) for n in sys.argv[1].split(","))
    for path in sys.argv[2:]:
        program = apply_schedule(coconet.load(path), "fuse(rs-c-ag)")
        step = compile(program, backend="cpu")
        plan = step.plan
        assert plan.nodes == want_nodes, (plan.nodes, want_nodes)
        across = [s for s in plan.steps if isinstance(s, Collective) and s.part == "across"]
        on_node = [
            s for s in plan.steps
            if isinstance(s, Launch) and any(isinstance(a, PeerTable) for a in s.args)
        ]
        assert {s.op for s in across} == {"reduce_scatter", "all_gather"}, plan.format()
        assert on_node and all(
            a.part == "node" for s in on_node for a in s.args if isinstance(a, PeerTable)
        ), plan.format()
        grid = plan.grid_shape
        logical = sim.prepare_inputs(program, None, grid, seed=3)
        coords = V.coords_of(rank, grid)
        mine = {
            n: V.piece_of(logical[n], b.type, coords, grid) for n, b in plan.arguments.items()
        }
        out = step(**mine)
        everyone = comm.gather({k: np.asarray(v) for k, v in out.items()}, root=0)
        if rank == 0:
            ref = sim.run(program, logical, ranks=size, inplace=False)
            result = compare_outputs(everyone, ref.per_rank)
            assert not result.differences, result.differences
            how = "bit-exact" if result.bit_exact else "within tolerance"
            print(f"{program.name}: hierarchical on nodes {list(plan.nodes)}, {how}")
        step.close()
        comm.Barrier()
    """
)


def run_job(tmp_path: Path, ranks: int, per_node: int, examples: list[str]):
    script = tmp_path / "hierarchical.py"
    script.write_text(SCRIPT)
    nodes = ",".join(str(r // per_node) for r in range(ranks))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COCONET_RANKS_PER_NODE": str(per_node)}
    paths = [str(ROOT / "examples" / f"{e}.mlir") for e in examples]
    return subprocess.run(
        [str(MPIEXEC), "-n", str(ranks), sys.executable, str(script), nodes, *paths],
        capture_output=True,
        check=False,
        text=True,
        timeout=240,
        env=env,
        cwd=ROOT,
    )


def test_two_nodes_of_two_run_fused_optimizers_hierarchically(tmp_path):
    examples = ["adam", "lamb", "sgd", "adam_f16_grads"]
    r = run_job(tmp_path, 4, 2, examples)
    assert r.returncode == 0, r.stdout + r.stderr
    for name in examples:
        assert f"{name}: hierarchical on nodes [0, 0, 1, 1], bit-exact" in r.stdout, r.stdout


def test_one_rank_per_node_and_slices_of_a_later_dim(tmp_path):
    # Every member on its own node (the node kernels serve one rank), and a model-parallel
    # reduce_scatter sliced along dim 1: pieces are strided runs in the packed buffers.
    r = run_job(tmp_path, 2, 1, ["model_parallel_mlp"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "model_parallel_mlp: hierarchical on nodes [0, 1]" in r.stdout, r.stdout


def test_coco_run_checks_a_two_node_job():
    env = {**os.environ, "COCONET_RANKS_PER_NODE": "2"}
    r = subprocess.run(
        [sys.executable, "-m", "coconet.tools.coco_run", "examples/lamb_scattered.mlir"]
        + ["--np", "4", "--backend", "cpu", "--schedule", "fuse(rs-c-ag)", "--check", "-q"],
        capture_output=True,
        check=False,
        text=True,
        timeout=180,
        cwd=ROOT,
        env=env,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "check [fuse(rs-c-ag)]: every rank's outputs match the sim oracle" in r.stdout


def test_nodes_holding_unequal_shares_of_a_group_are_refused():
    env = {**os.environ, "COCONET_RANKS_PER_NODE": "3"}
    r = subprocess.run(
        [sys.executable, "-m", "coconet.tools.coco_run", "examples/adam.mlir"]
        + ["--np", "4", "--backend", "cpu", "--schedule", "fuse(rs-c-ag)"],
        capture_output=True,
        check=False,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=env,
    )
    assert r.returncode != 0
    assert "[fused-across-nodes]" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr, r.stderr

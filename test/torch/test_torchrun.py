"""coconet under torchrun: `compile()` joins the torch.distributed job (gloo for library
collectives, POSIX shared memory for fused kernels) with no MPI, and every schedule gives every
rank the right answer; a process launched as one of several that cannot join its job refuses
with one clear message instead of running as a 1-rank job (replicas silently diverging)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

torch = pytest.importorskip("torch", reason="the test extra installs torch")

from torchrun_job import clean_env, torchrun_two  # noqa: E402 (after the importorskip)

# SGD on 2 ranks: rank r's local gradient is r+1 everywhere, w = 1, lr = 0.25, so after the
# all-reduce every rank must hold w = 1 - 0.25 * (1 + 2) = 0.25. A silent 1-rank run gives
# 0.75 on rank 0 and 0.5 on rank 1.
SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import coconet

    out = {}
    for schedule in sys.argv[2:]:
        step = coconet.compile("examples/sgd.mlir", schedule=schedule, backend="cpu")
        rank = step.rank
        g = np.full(4096, rank + 1.0, np.float32)
        w = np.ones(4096, np.float32)
        res = step(g=g, w=w, lr=0.25)
        out[schedule] = [float(res["w"].min()), float(res["w"].max()), step.size]
        step.close()
    with open(f"{sys.argv[1]}/rank{rank}.json", "w") as f:  # stdout of two ranks interleaves
        json.dump(out, f)
    """
)


def _env(**extra: str) -> dict[str, str]:
    return clean_env() | extra


def test_compile_under_torchrun_joins_the_job_for_every_schedule(tmp_path):
    script = tmp_path / "sgd_step.py"
    script.write_text(SCRIPT)
    schedules = ["ar-c", "rs-c-ag", "fuse(rs-c-ag)"]
    proc = torchrun_two(str(script), str(tmp_path), *schedules, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = {r: json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)}
    for rank, per_schedule in results.items():
        for schedule in schedules:
            lo, hi, size = per_schedule[schedule]
            assert size == 2, (rank, schedule)
            assert lo == hi == 0.25, (rank, schedule, lo, hi)


def _run_alone(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        cwd=ROOT,
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
    )


CALL = (
    "import coconet\n"
    "from coconet.core.program import CocoError\n"
    "try:\n"
    "    coconet.compile('examples/sgd.mlir', backend='cpu')\n"
    "except CocoError as e:\n"
    "    print('REFUSED', e)\n"
)


def test_a_torchrun_process_without_torch_refuses_instead_of_running_alone():
    proc = _run_alone(
        "import sys; sys.modules['torch'] = None\n" + CALL,
        RANK="1",
        WORLD_SIZE="2",
        LOCAL_RANK="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT="29999",
        TORCHELASTIC_RUN_ID="test",
    )
    assert "REFUSED" in proc.stdout, proc.stdout + proc.stderr
    assert "rank 1 of 2 started by torchrun" in proc.stdout
    assert "PyTorch cannot be imported" in proc.stdout


@pytest.mark.parametrize(
    ("env", "says"),
    [
        # torchrun's variables in a process torchrun did not start: it would wait forever
        (
            {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29997"},
            "torchrun did not start this process (TORCHELASTIC_RUN_ID is unset)",
        ),
        ({"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE=0: a job has at least one process"),
        ({"RANK": "0", "WORLD_SIZE": "-2"}, "WORLD_SIZE=-2: a job has at least one process"),
        (
            {"RANK": "2", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "t"},
            "RANK=2 with WORLD_SIZE=2: RANK must be in 0..1",
        ),
        ({"RANK": "x", "WORLD_SIZE": "2"}, "torchrun's variables must be integers"),
    ],
)
def test_torchrun_variables_that_describe_no_job_are_refused_at_once(env, says):
    proc = _run_alone(CALL, **env)
    assert "REFUSED" in proc.stdout, proc.stdout + proc.stderr
    assert says in proc.stdout, proc.stdout


def test_a_hand_made_env_launch_is_accepted_when_declared():
    """COCONET_ENV_LAUNCH=1: a launcher of one's own set torchrun's variables on purpose; a
    one-process world of it runs."""
    proc = _run_alone(
        CALL + "else:\n    print('RAN')\n",
        RANK="0",
        WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT="29996",
        COCONET_ENV_LAUNCH="1",
    )
    assert "RAN" in proc.stdout, proc.stdout + proc.stderr


def test_an_mpi_launch_that_mpi4py_cannot_see_is_refused():
    # the launcher says 2 processes, but this mpi4py's world has 1 (another MPI library)
    proc = _run_alone(CALL, PMI_SIZE="2", PMI_RANK="0")
    assert "REFUSED" in proc.stdout, proc.stdout + proc.stderr
    assert "launched as one of 2" in proc.stdout
    assert "MPI sees a world of 1" in proc.stdout


def test_coco_run_under_torchrun_runs_each_process_as_one_rank():
    proc = torchrun_two(
        "-m",
        "coconet.tools.coco_run",
        "examples/adam.mlir",
        "--backend",
        "cpu",
        "--schedule",
        "ar-c",
        "--schedule",
        "fuse(rs-c-ag)",
        "--check",
        "--bench",
        "--iters",
        "2",
        "--warmup",
        "1",
        "-q",
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "check [ar-c]: every rank's outputs match the sim oracle" in out
    assert "check [fuse(rs-c-ag)]: every rank's outputs match the sim oracle" in out
    assert "on 2 rank(s), backend cpu" in out


def test_coco_run_under_torchrun_refuses_a_different_np():
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "coconet.tools.coco_run",
            "examples/sgd.mlir",
            "--backend",
            "cpu",
            "--np",
            "4",
        ],
        check=False,
        cwd=ROOT,
        env=_env(
            RANK="0",
            WORLD_SIZE="2",
            LOCAL_RANK="0",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT="29998",
            TORCHELASTIC_RUN_ID="test",
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert "torchrun started 2 process(es)" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_carries_host_tensors_reads_torchs_backend_strings():
    from coconet.runtime.torch_comm import carries_host_tensors

    assert carries_host_tensors("gloo")
    assert carries_host_tensors("mpi")
    assert not carries_host_tensors("nccl")
    assert carries_host_tensors("cpu:gloo,cuda:nccl")
    assert not carries_host_tensors("cuda:nccl")


# A GPU job's default group is NCCL, which carries no CPU tensors. Without a GPU the script
# starts gloo and makes torch report "nccl" for the default group: coconet must then run its
# host traffic over a gloo group of its own (made once, however many programs are compiled),
# and the job must still give every rank the right answer.
NCCL_DEFAULT_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import torch.distributed as dist
    import coconet
    from coconet.runtime import torch_comm

    dist.init_process_group("gloo")
    real = dist.get_backend
    dist.get_backend = lambda group=None: "nccl" if group is None else real(group)
    out = []
    for schedule in ("ar-c", "fuse(rs-c-ag)"):
        step = coconet.compile("examples/sgd.mlir", schedule=schedule, backend="cpu")
        g = np.full(4096, step.rank + 1.0, np.float32)
        res = step(g=g, w=np.ones(4096, np.float32), lr=0.25)
        group = step.comm.group
        own = group is not None and real(group) == "gloo"
        out.append([float(res["w"].min()), float(res["w"].max()), own, id(group)])
        step.close()
    with open(f"{sys.argv[1]}/rank{dist.get_rank()}.json", "w") as f:
        json.dump(out, f)
    dist.destroy_process_group()
    """
)


def test_a_default_group_that_carries_no_host_tensors_gets_a_gloo_group(tmp_path):
    script = tmp_path / "nccl_default.py"
    script.write_text(NCCL_DEFAULT_SCRIPT)
    r = torchrun_two(str(script), str(tmp_path), timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    for rank in (0, 1):
        runs = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert [(lo, hi) for lo, hi, _b, _g in runs] == [(0.25, 0.25)] * 2
        assert all(own for _lo, _hi, own, _g in runs), "the default group was used"
        assert len({g for *_x, g in runs}) == 1, "one gloo group for every program"


# Each rank compiles SGD with what argv says and reports what compile() or the first call
# said: a schedule per rank, and a w that may differ per rank.
AGREEMENT_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import coconet
    from coconet.core.program import CocoError

    out_dir, cases = sys.argv[1], sys.argv[2:]
    import torch.distributed as dist
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    said = []
    for case in cases:  # "SCHEDULE0/SCHEDULE1:OFFSET0/OFFSET1", one compile() each, in turn
        schedules, w_offsets = (part.split("/") for part in case.split(":"))
        try:
            step = coconet.compile("examples/sgd.mlir", schedule=schedules[rank], backend="cpu")
            w = np.full(4096, 1.0 + float(w_offsets[rank]), np.float32)
            g = np.ones(4096, np.float32)
            step(g=g, w=w, lr=0.25)
            said.append("ran")
            for _ in range(3):  # steady calls: the verdict agreed on one int
                step(g=g, w=w, lr=0.25)
            # then rank 1 alone passes a wrong g: refused on both ranks, naming it
            step(g=np.ones(3, np.float32) if rank == 1 else g, w=w, lr=0.25)
            said.append("a wrong g ran")
        except CocoError as e:
            said.append(str(e))
        dist.barrier()  # the next case starts on both ranks after this one ended on both
    with open(f"{out_dir}/rank{rank}.json", "w") as f:
        json.dump(said, f)
    dist.destroy_process_group()  # the script made the group: gloo's threads end before exit
    """
)


def test_ranks_that_disagree_are_refused_on_every_rank_and_then_agree(tmp_path):
    """compile() refuses, on every rank, ranks that compiled different schedules, and ranks
    passing different values for a replicated argument; the same ranks then agree and run,
    and after steady calls one rank's wrong input is refused on both.
    One torchrun job runs the cases in turn (each compile() a job of its own)."""
    cases = ["ar-c/fuse(rs-c-ag):0/0", "ar-c/ar-c:0/0.5", "ar-c/ar-c:0/0"]
    script = tmp_path / "agree.py"
    script.write_text(AGREEMENT_SCRIPT)
    proc = torchrun_two(str(script), str(tmp_path), *cases, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    said = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    schedules, values, agreeing, refused = zip(*said, strict=True)
    for s in schedules:
        assert "rank 1 compiled another program or schedule than rank 0" in s, said
        assert "'fuse(rs-c-ag)'" in s, said
    for s in values:
        assert "input 'w' is replicated, but rank 1 passed another value than rank 0" in s, said
    assert agreeing == ("ran", "ran")
    assert "rank 1 refused its inputs" in refused[0], said
    for s in refused:
        assert "rank 1 must pass its piece of shape [4096], got [3]" in s, said


def test_ranks_end_when_their_torchrun_agent_dies(tmp_path):
    """The agent (torchrun) is SIGKILLed while its ranks wait in a step: each rank sees its
    parent gone and ends, instead of running on as an orphan."""
    import signal
    import time

    psutil = pytest.importorskip("psutil")
    script = tmp_path / "wait.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, sys, time
            import coconet
            step = coconet.compile("examples/sgd.mlir", backend="cpu")
            open(f"{sys.argv[1]}/rank{step.rank}.pid", "w").write(str(os.getpid()))
            while True:
                time.sleep(1)
            """
        )
    )
    agent = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
        + [str(script), str(tmp_path)],
        cwd=ROOT,
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        pids = []
        while time.monotonic() < deadline and len(pids) < 2:
            pids = [int(p.read_text()) for p in tmp_path.glob("rank*.pid") if p.read_text()]
            time.sleep(0.2)
        assert len(pids) == 2, "the ranks never started"
        ranks = [psutil.Process(pid) for pid in pids]
        agent.send_signal(signal.SIGKILL)
        agent.wait(timeout=30)
        _gone, alive = psutil.wait_procs(ranks, timeout=10)
        assert not alive, f"ranks still running 10 s after their agent died: {alive}"
    finally:
        agent.kill()
        for p in tmp_path.glob("rank*.pid"):
            try:
                os.kill(int(p.read_text()), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass


def test_a_stopped_rank_ends_with_the_job_without_torchrun_s_grace(tmp_path):
    """Rank 1 stops (SIGSTOP) before its first call; rank 0's step timeout (3 s) names it
    and aborts. A stopped process ignores torchrun's SIGTERM until its 30 s grace ends in
    SIGKILL (the job took ~40 s); coconet's abort kills the job's ranks on this machine, as
    MPI_Abort does, so the job ends within seconds of the timeout."""
    import time

    script = tmp_path / "stop.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, signal
            import numpy as np
            import coconet
            step = coconet.compile("examples/sgd.mlir", backend="cpu", step_timeout=3)
            if step.rank == 1:
                os.kill(os.getpid(), signal.SIGSTOP)
            w = np.ones(4096, np.float32)
            step(g=np.ones(4096, np.float32), w=w, lr=0.25)
            """
        )
    )
    start = time.monotonic()
    proc = torchrun_two(str(script), timeout=120)
    took = time.monotonic() - start
    assert proc.returncode != 0
    assert "waiting for every rank at the input check of call 1" in proc.stderr, proc.stderr[-3000:]
    # Without the kill the job cannot end before the 3 s timeout plus torchrun's 30 s grace:
    # a bound that load cannot make the fixed job miss nor the broken one meet.
    assert took < 33, f"the job took {took:.1f} s to end"


def test_all_to_all_under_torchrun_moves_uneven_runs_over_gloo(tmp_path):
    """comm.all_to_all over gloo: all_to_all_single with split sizes (uneven runs: 7 and 9
    do not divide by 2; the innermost dim re-cut), and the dispatch form."""
    s, t, loc = (
        "!coco.tensor<7x9xf32, sliced<0>>",
        "!coco.tensor<7x9xf32, sliced<1>>",
        "!coco.tensor<4x3xbf16, local>",
    )
    path = tmp_path / "a2a.mlir"
    path.write_text(
        f"func.func @a2a(%x: {s}, %d: {loc}) -> ({t}, {s}, {loc}) "
        "attributes {coco.grid = #coco.grid<[?]>} {\n"
        f"  %y = comm.all_to_all %x : {s} -> {t}\n"
        f"  %z = comm.all_to_all %y : {t} -> {s}\n"
        f"  %e = comm.all_to_all %d : {loc}\n"
        f"  func.return %y, %z, %e : {t}, {s}, {loc}\n}}\n"
    )
    proc = torchrun_two(
        "-m", "coconet.tools.coco_run", str(path), "--backend", "cpu", "--check",
        "--exact-collectives", "-q", timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "every rank's outputs match the sim oracle (bit-exact)" in proc.stdout

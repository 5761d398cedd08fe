"""Faults on real `coco-run` jobs (fault_harness.py): a rank SIGKILLed in the middle of a
`--bench` loop, a rank raising, a rank whose kernels do not compile, a rank that never arrives
at the next barrier, a rank exiting while a child it forked holds its sockets -- each on 2 and
4 ranks. Every case must end every process of the job
(mpiexec, hydra's proxy, every rank, the front end) within 10 s of the fault, the front end
with status 1 and one `coco-run: error:` line naming the failing rank, no traceback, and no
process left behind; and every rank's own end, as its supervisor recorded it, is a failure (a
non-zero exit status or a signal; SIGKILL for the killed rank) within 10 s of the fault. `benchmarks/reliability.py` prints the same measurements as a table.
"""

from __future__ import annotations

import pytest
from fault_harness import FAULTS, MPIEXEC, run_fault

pytestmark = [
    pytest.mark.mpi,
    pytest.mark.skipif(not MPIEXEC.exists(), reason="needs the mpich wheel's mpiexec"),
]

# What the user's one line must say, by fault (the failing rank is the last one, R).
EXPECT = {
    "sigkill": "rank {R} (pid",
    "exception": "rank {R}: InjectedFault: injected fault at step 1",
    "compile": "rank {R}: compiling the kernels of @sgd failed",
    "absent": "rank {R} never arrived at the start of bench iteration 1",
    "fork-exit": "rank {R} (pid",
}


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("kind", FAULTS)
def test_a_fault_on_one_rank_ends_every_process_promptly(kind, ranks):
    run = run_fault(kind, ranks)
    ends = ", ".join(f"{r}: {run.rank_end(r)}" for r in range(ranks))
    report = (
        f"{kind} on {ranks} ranks: status {run.returncode}, rank ends {ends} "
        f"(recorded {run.rank_exits}), ranks gone at {run.gone_at} s, "
        f"fault at {run.fault_at} s, all gone at {run.all_gone_at} s, orphans {run.orphans}\n"
        f"{run.stderr}"
    )
    print(report)
    assert not run.orphans, report
    assert run.all_gone_at is not None, report
    assert sorted(run.rank_pids) == list(range(ranks)), report  # every rank was followed
    assert sorted(run.gone_at) == list(range(ranks)), report
    assert run.returncode == 1, report
    assert run.fault_to_all_gone is not None, report
    assert run.fault_to_all_gone < 10.0, report
    assert run.message.startswith("coco-run: error: "), report
    assert EXPECT[kind].format(R=ranks - 1) in run.message, report
    assert "Traceback" not in run.stderr, report
    # Every rank's own end: recorded for each (the pid is the rank process that was followed),
    # none of them a clean exit, the last within 10 s of the fault.
    assert run.every_rank_failed, report
    assert {r: e["pid"] for r, e in run.rank_exits.items()} == run.rank_pids, report
    assert run.fault_to_last_rank_exit is not None, report
    assert run.fault_to_last_rank_exit < 10.0, report
    if kind == "fork-exit":
        assert "exited with status 3 without reporting an error" in run.message, report
        assert run.rank_end(ranks - 1) == "exit 3", report
    if kind == "sigkill":
        assert "SIGKILL" in run.message, report
        assert run.rank_end(ranks - 1) == "SIGKILL", report

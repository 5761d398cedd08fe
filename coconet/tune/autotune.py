"""The autotuner: rank a program's schedules with the cost model and pick the fastest.

    from coconet.tune.autotune import rank_schedules, resolve_profile
    ranking = rank_schedules(program, ranks=4, profile=resolve_profile("dgx-a100", "cuda", 4))
    ranking.best.name, ranking.best.pipeline, ranking.best.prediction.seconds
    print(ranking.explain())

The space is every named schedule that fits the program (coconet/schedule/enumerator.py
`named_schedules`) and every schedule `enumerate_scheduled_programs` lists; schedules whose IR
is the same are one candidate (its first name kept, the others as aliases). Each candidate is
lowered for the rank count and the profile's nodes (a fused collective whose group spans
nodes lowers hierarchically) and priced by coconet/tune/cost_model.py; candidates the lowering
refuses for that rank count are listed as refused, never silently dropped.

`--schedule auto` (coco-run), `compile(..., schedule="auto")` and `coconet.torch`'s
`schedule="auto"` resolve to the best candidate's pipeline. The profile: `cpu` (this host,
measured once per rank count and cached: coconet/tune/machine_probe.py), a published GPU node
(`dgx2-v100`, `dgx-a100`, `dgx-h100`, `dgx-h200`), or a JSON file of a `MachineProfile`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coconet.core.program import CocoError, Program
from coconet.tune.cost_model import (
    PUBLISHED_PROFILES,
    MachineProfile,
    Prediction,
    predict,
    published_profile,
)

__all__ = [
    "AUTO",
    "Candidate",
    "Ranking",
    "candidate_schedules",
    "is_auto",
    "rank_schedules",
    "resolve_profile",
]

AUTO = "auto"
PROFILE_ENV = "COCONET_PROFILE"


def is_auto(schedule: str | None) -> bool:
    return schedule is not None and schedule.strip().lower() == AUTO


@dataclass
class Candidate:
    name: str
    pipeline: str
    program: Program
    aliases: list[str] = field(default_factory=list)
    prediction: Prediction | None = None
    refused: str | None = None  # why the lowering refused it for this rank count

    @property
    def spec(self) -> str | None:
        """What coco-run / compile() apply: the pipeline (None: the program as written)."""
        return self.pipeline or None

    @property
    def seconds(self) -> float:
        return self.prediction.seconds if self.prediction else float("inf")


@dataclass
class Ranking:
    profile: MachineProfile
    ranks: int
    ranked: list[Candidate]  # fastest first
    refused: list[Candidate]

    @property
    def best(self) -> Candidate:
        if not self.ranked:
            reasons = "; ".join(f"{c.name}: {c.refused}" for c in self.refused[:3])
            raise CocoError(
                f"[autotune-empty] no schedule of this program lowers for {self.ranks} rank(s)"
                + (f" ({reasons})" if reasons else "")
            )
        return self.ranked[0]

    def find(self, name: str) -> Candidate | None:
        for c in self.ranked + self.refused:
            if c.name == name or name in c.aliases:
                return c
        return None

    def headline(self) -> str:
        """One line: what was picked and why (its predicted time against the runners-up)."""
        best = self.best
        assert best.prediction is not None  # ranked candidates are priced
        others = ", ".join(f"{c.name} {_ms(c.seconds)}" for c in self.ranked[1:3])
        return (
            f"auto picked {best.name} on {self.ranks} rank(s): predicted {_ms(best.seconds)} "
            f"per step on profile {self.profile.name} ({best.prediction.summary(2)})"
            + (f"; next: {others}" if others else "")
            + f"; {len(self.ranked)} candidate(s) ranked"
            + (f", {len(self.refused)} refused (lowering or machine)" if self.refused else "")
        )

    def explain(self, top: int = 8) -> str:
        lines = [self.headline(), f"  {'rank':>4}  {'predicted':>11}  {'bound by':<28} schedule"]
        for i, c in enumerate(self.ranked[:top], 1):
            assert c.prediction is not None
            lines.append(f"  {i:>4}  {_ms(c.seconds):>11}  {_bounds(c.prediction):<28} {c.name}")
        if len(self.ranked) > top:
            lines.append(f"  ... {len(self.ranked) - top} more")
        return "\n".join(lines)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"


def _bounds(p: Prediction) -> str:
    """The terms that bound a prediction's time, by share."""
    share: dict[str, float] = {}
    for s in p.steps:
        share[s.bound] = share.get(s.bound, 0.0) + s.seconds
    total = sum(share.values()) or 1.0
    top = sorted(share.items(), key=lambda kv: -kv[1])[:2]
    return ", ".join(f"{k} {v / total:.0%}" for k, v in top)


def candidate_schedules(
    program: Any, *, space: str = "all", ranks: int | None = None
) -> list[Candidate]:
    """The schedules to rank: the named ones that fit, then (space "all") every enumerated
    one; one candidate per distinct IR. `ranks`: only schedules that launch on that many
    ranks (default: those offered at the enumerator's DEFAULT_RANKS)."""
    from coconet.schedule import apply_schedule, enumerate_scheduled_programs, named_schedules
    from coconet.schedule.steps import as_program

    p = as_program(program)
    by_ir: dict[str, Candidate] = {}
    out: list[Candidate] = []

    def add(name: str, pipeline: str, scheduled: Program) -> None:
        ir = str(scheduled.module)
        if ir in by_ir:
            by_ir[ir].aliases.append(name)
            return
        c = Candidate(name, pipeline, scheduled)
        by_ir[ir] = c
        out.append(c)

    add("as-written", "", p)
    for name, pipeline in named_schedules(p, ranks=ranks).items():
        add(name, pipeline, apply_schedule(p, name))
    if space == "all":
        for name, pipeline, scheduled in enumerate_scheduled_programs(p, ranks=ranks):
            add(name, pipeline, scheduled)
    elif space != "named":
        raise CocoError(f"[autotune-space] unknown space '{space}': use 'all' or 'named'")
    return out


def profile_nodes(profile: MachineProfile, ranks: int) -> tuple[int, ...]:
    """The node of each of `ranks` ranks on `profile`'s machine (`ranks_per_node` consecutive
    ranks a node); () when they fit on one node."""
    if ranks <= profile.ranks_per_node:
        return ()
    return tuple(r // profile.ranks_per_node for r in range(ranks))


def rank_schedules(
    program: Any,
    ranks: int,
    profile: MachineProfile,
    *,
    space: str = "all",
    candidates: list[Candidate] | None = None,
) -> Ranking:
    """Every candidate lowered for `ranks` ranks and priced on `profile`, fastest first (ties:
    the earlier candidate, i.e. the simpler schedule)."""
    from coconet.lowering.lower_to_plan import lower

    cands = (
        candidates
        if candidates is not None
        else candidate_schedules(program, space=space, ranks=ranks)
    )
    ranked: list[Candidate] = []
    refused: list[Candidate] = []
    # Lowered for the profile's nodes, as a job on that machine would be: fused collectives
    # spanning nodes run hierarchically, a fused send between nodes sends through the library.
    nodes = profile_nodes(profile, ranks)
    for c in cands:
        try:
            plan = lower(c.program, ranks, None, nodes)
            c.prediction = predict(plan, profile)
        except CocoError as e:
            c.refused = str(e).splitlines()[0]
            refused.append(c)
            continue
        ranked.append(c)
    order = {id(c): i for i, c in enumerate(cands)}
    ranked.sort(key=lambda c: (c.seconds, order[id(c)]))
    return Ranking(profile, ranks, ranked, refused)


def resolve_profile(
    spec: str | None,
    backend: str,
    ranks: int,
    comm: Any = None,
    log: Callable[[str], None] | None = None,
) -> MachineProfile:
    """The machine profile named by `spec` (or $COCONET_PROFILE): `cpu` (this host, measured
    for `ranks` ranks, cached; with `comm`, measured collectively on it), a published profile's
    name, or a JSON file of a profile. Without one: `cpu` for the cpu and sim backends; the cuda
    backend needs one named (no GPU profile is measured)."""
    spec = spec or os.environ.get(PROFILE_ENV) or None
    if spec is None:
        if backend == "cuda":
            raise CocoError(
                "[profile-needed] --schedule auto on the cuda backend needs a machine profile: "
                f"--profile NAME ({', '.join(PUBLISHED_PROFILES)}) or --profile FILE.json "
                f"(or ${PROFILE_ENV})"
            )
        spec = "cpu"
    if spec == "cpu":
        from coconet.tune.machine_probe import cpu_profile

        return cpu_profile(ranks, comm, log=log)
    if spec in PUBLISHED_PROFILES:
        return published_profile(spec)
    path = Path(spec)
    if path.suffix == ".json" or path.exists():
        try:
            return MachineProfile.from_json(json.loads(path.read_text()))
        except OSError as e:
            raise CocoError(
                f"[profile-file] cannot read the profile {spec}: {e.strerror}"
            ) from None
        except (json.JSONDecodeError, ValueError) as e:
            raise CocoError(f"[profile-file] {spec} is not a machine profile: {e}") from None
    return published_profile(spec)  # raises [profile-unknown] naming the choices


# ---------------------------------------------------------------------------------------------
# Measuring candidates (coco-tune, the benchmark report)
# ---------------------------------------------------------------------------------------------


def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman's rank correlation of two equally long samples (ties get their mean rank);
    nan with fewer than 2 points or a constant sample."""
    import math

    if len(xs) != len(ys):
        raise ValueError("spearman: samples of different lengths")
    if len(xs) < 2:
        return math.nan

    def ranks(v: list[float]) -> list[float]:
        order = sorted(range(len(v)), key=v.__getitem__)
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2 + 1
            i = j + 1
        return r

    rx, ry = ranks(xs), ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    vx = sum((a - mx) ** 2 for a in rx)
    vy = sum((b - my) ** 2 for b in ry)
    if vx == 0 or vy == 0:
        return math.nan
    return cov / math.sqrt(vx * vy)

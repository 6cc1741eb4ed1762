"""The machine's state around timed code: CPU used by other processes, steal time, context switches, clock.

Read from ``/proc`` before and after a timed stretch (never inside it): the worker's whole timing loop when a
cell is timed in one go, and a round's whole span of interleaved cycles in the manager (counting every fwbench
process as its own, so that idle workers and the manager are not "other"). Never per block: the kernel's
machine-wide counters are tick samples (USER_HZ, 10 ms), and over 50 ms blocks that follow an idle pause they
read ~5% of a core too high even on an idle machine; over seconds the error is well under 1%.

A cell is *contended* when, while it was timed,

- other processes used more than :data:`OTHER_CPU_LIMIT_CORES` of a core on average: fwbench's own idle
  workers and manager use well under 1% of a core (``tests/test_interleave.py`` checks it), so 10% is ten
  times our own floor, and enough to cost a pinned single-thread cell several percent whenever the scheduler
  puts the other work on its core;
- or the hypervisor stole more than :data:`STEAL_LIMIT_FRACTION` of the machine's CPU time: 2% is about the
  size of the differences fwbench is asked to resolve (a ±1–5% CI), so steal above it can decide a verdict.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

OTHER_CPU_LIMIT_CORES = 0.10
STEAL_LIMIT_FRACTION = 0.02
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class Counters:
    """Cumulative counters at one instant: machine-wide busy / steal / all CPU time and our processes' CPU
    time (seconds), their involuntary context switches, and the clocks (MHz) of this process's CPUs."""

    wall_s: float
    machine_busy_s: float
    machine_steal_s: float
    machine_total_s: float
    process_cpu_s: float
    involuntary_switches: int
    clock_mhz: tuple[float, ...]


def _machine_cpu() -> tuple[float, float, float]:
    """(busy, steal, total) CPU seconds of the whole machine since boot, from the ``cpu`` line of /proc/stat."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
        user, nice, system, idle, iowait, irq, softirq, steal = (int(v) for v in fields[:8])
    except (OSError, ValueError):
        return 0.0, 0.0, 0.0
    busy = user + nice + system + irq + softirq
    total = busy + idle + iowait + steal
    return busy / CLOCK_TICKS, steal / CLOCK_TICKS, total / CLOCK_TICKS


def process_cpu_seconds(pid: int | str = "self") -> float | None:
    """CPU time of process ``pid`` (all its threads) in seconds: the sum of its threads' on-CPU nanoseconds from
    /proc/PID/task/*/schedstat, else utime + stime from /proc/PID/stat (10 ms ticks); None if unreadable."""
    try:
        total_ns = 0
        for task in Path(f"/proc/{pid}/task").iterdir():
            total_ns += int((task / "schedstat").read_text().split()[0])
        return total_ns / 1e9
    except (OSError, ValueError, IndexError):
        pass  # a thread that ended mid-read, or no schedstat: the coarser counter
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
        fields = text[text.rindex(")") + 2 :].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    except (OSError, ValueError, IndexError):
        return None


def _involuntary_switches(pid: int | str) -> int:
    total = 0
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            for line in (task / "status").read_text().splitlines():
                if line.startswith("nonvoluntary_ctxt_switches:"):
                    total += int(line.split()[1])
    except (OSError, ValueError):
        pass
    return total


def _clocks() -> tuple[float, ...]:
    clocks: list[float] = []
    for cpu in sorted(os.sched_getaffinity(0)):
        try:
            clocks.append(int(Path(f"/sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_cur_freq").read_text()) / 1000)
        except (OSError, ValueError):
            continue
    return tuple(clocks)


def read(wall_s: float, pids: Sequence[int | str] = ("self",)) -> Counters:
    """The counters now, ``pids`` counting as our own processes (their CPU time and involuntary context switches
    summed); ``wall_s`` is the caller's clock (time.perf_counter()) at the same instant."""
    busy, steal, total = _machine_cpu()
    return Counters(
        wall_s=wall_s,
        machine_busy_s=busy,
        machine_steal_s=steal,
        machine_total_s=total,
        process_cpu_s=sum(process_cpu_seconds(pid) or 0.0 for pid in pids),
        involuntary_switches=sum(_involuntary_switches(pid) for pid in pids),
        clock_mhz=_clocks(),
    )


@dataclass
class NoiseTotals:
    """Sums over a cell's timed intervals: wall seconds, other processes' CPU seconds, stolen and total machine
    CPU seconds, involuntary context switches, and the lowest / highest clock seen (MHz, None if unreadable)."""

    wall_s: float = 0.0
    other_cpu_s: float = 0.0
    steal_s: float = 0.0
    machine_s: float = 0.0
    involuntary_switches: int = 0
    clock_min_mhz: float | None = None
    clock_max_mhz: float | None = None

    def add(self, before: Counters, after: Counters) -> None:
        """Add the interval from ``before`` to ``after`` (a timed block)."""
        self.wall_s += after.wall_s - before.wall_s
        own = after.process_cpu_s - before.process_cpu_s
        self.other_cpu_s += max(0.0, after.machine_busy_s - before.machine_busy_s - own)
        self.steal_s += after.machine_steal_s - before.machine_steal_s
        self.machine_s += after.machine_total_s - before.machine_total_s
        self.involuntary_switches += after.involuntary_switches - before.involuntary_switches
        clocks = before.clock_mhz + after.clock_mhz
        if clocks:
            low, high = min(clocks), max(clocks)
            self.clock_min_mhz = low if self.clock_min_mhz is None else min(self.clock_min_mhz, low)
            self.clock_max_mhz = high if self.clock_max_mhz is None else max(self.clock_max_mhz, high)

    def merge(self, other: NoiseTotals) -> None:
        """Add another cell part's totals (another round) to these."""
        self.wall_s += other.wall_s
        self.other_cpu_s += other.other_cpu_s
        self.steal_s += other.steal_s
        self.machine_s += other.machine_s
        self.involuntary_switches += other.involuntary_switches
        for name, pick in (("clock_min_mhz", min), ("clock_max_mhz", max)):
            mine, theirs = getattr(self, name), getattr(other, name)
            setattr(self, name, theirs if mine is None else mine if theirs is None else pick(mine, theirs))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NoiseTotals:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


def other_cpu_cores(totals: NoiseTotals) -> float | None:
    """Average CPU used by other processes while timed, in cores (0.1 = 10% of one core)."""
    return totals.other_cpu_s / totals.wall_s if totals.wall_s > 0 else None


def steal_fraction(totals: NoiseTotals) -> float | None:
    """Stolen CPU time over all the machine's CPU time while timed."""
    return totals.steal_s / totals.machine_s if totals.machine_s > 0 else None


def contention(totals: NoiseTotals) -> list[str]:
    """Why the cell counts as contended (empty when it does not), one phrase per exceeded limit."""
    reasons: list[str] = []
    other, steal = other_cpu_cores(totals), steal_fraction(totals)
    if other is not None and other > OTHER_CPU_LIMIT_CORES:
        reasons.append(f"other processes used {other:.0%} of a core while timed (limit {OTHER_CPU_LIMIT_CORES:.0%})")
    if steal is not None and steal > STEAL_LIMIT_FRACTION:
        reasons.append(f"steal {steal:.1%} of CPU time (limit {STEAL_LIMIT_FRACTION:.0%})")
    return reasons

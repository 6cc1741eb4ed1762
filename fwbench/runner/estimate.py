"""A rough wall-clock estimate of a plan, before running it (``fwbench list``, the start of ``run``).

Per cell: a worker's start-up (interpreter and framework import, measured on a 2-core machine),
building the weights, the mode's compile time, the first call, warm-up, timing (bounded by the
protocol), and the parity check (which compiles again at the small parity shape). Call times come
from the model's FLOPs at a nominal throughput, so the estimate is an order of magnitude, not a
prediction: it is labelled as such wherever it is shown. Each phase puts these parts together for its cells
(:meth:`fwbench.runner.phases.Phase.estimate_cell_s`). Nothing here imports a framework.
"""

from __future__ import annotations

from fwbench.frameworks import runtimes  # the registry: no framework is imported
from fwbench.measure.timer import HF2019_NUMBER, HF2019_REPEAT, MIN_ADAPTIVE_SAMPLES
from fwbench.models import get_model
from fwbench.spec import Case, Settings

# A runtime's start-up and compile seconds are in its registry record (RuntimeInfo.startup_s, .compile_s);
# these are for a runtime that is not registered here (a stored plan's plugin runtime that is not loaded).
DEFAULT_STARTUP_S = 2.0
DEFAULT_COMPILE_S = 0.0
NOMINAL_FLOPS_PER_S_PER_THREAD = 40e9  # fp32, a modern x86 core; real models reach less or more
BUILD_S_PER_PARAMETER = 1e-8  # seeded weights: loading the run's file of them and converting, ~10 ns per parameter
PER_CALL_OVERHEAD_S = 5e-5  # a framework call on a tiny model
FIT_STEP_OVERHEAD_S = 1e-3  # phase fit: data loading, the API's callbacks and loss bookkeeping per step (MLP, 2 cores)
IMAGE_S = 5e-3  # phase data: decoding, cropping to 224 px and normalising one ~256 px JPEG on one core


def startup_and_compile_s(runtime: str) -> tuple[float, float]:
    """(seconds to start a worker and import the framework, seconds the mode compiles a small model in its
    first call), from the runtime's registry record."""
    info = runtimes().get(runtime)
    return (DEFAULT_STARTUP_S, DEFAULT_COMPILE_S) if info is None else (info.startup_s, info.compile_s)


def call_s(flops: int | None, settings: Settings, runtime: str | None = None) -> float:
    """Seconds of one call of ``flops`` FLOPs at the nominal throughput of ``settings.threads`` threads, or of the
    threads ``runtime`` computes on, at the share of it the runtime reaches (its registry record)."""
    info = None if runtime is None else runtimes().get(runtime)
    threads = settings.threads if info is None or info.threads_used is None else info.threads_used
    share = 1.0 if info is None else info.throughput_share
    return PER_CALL_OVERHEAD_S + (flops or 0) / (NOMINAL_FLOPS_PER_S_PER_THREAD * share * threads)


def timing_s(call: float, settings: Settings) -> float:
    """Seconds the timing protocol spends on calls of ``call`` seconds (the adaptive one: bounded by max_time_s)."""
    if settings.protocol == "hf2019":
        return HF2019_REPEAT * HF2019_NUMBER * call
    return min(settings.max_time_s, max(MIN_ADAPTIVE_SAMPLES * max(call, settings.min_block_s), 2 * call))


def setup_s(case: Case) -> float:
    """Seconds a worker of ``case`` takes before its first call, each round: start-up, building the weights, and
    compiling twice (once more at the parity shape)."""
    startup, compile_s = startup_and_compile_s(case.runtime)
    return startup + BUILD_S_PER_PARAMETER * get_model(case.model).parameter_count() + 2 * compile_s


def format_estimate(seconds: float) -> str:
    """``~40 s``, ``~12 min``, ``~2.5 h``: one significant-looking figure, an order of magnitude."""
    if seconds < 90:
        return f"~{seconds:.0f} s"
    if seconds < 5400:
        return f"~{seconds / 60:.0f} min"
    return f"~{seconds / 3600:.1f} h"

"""A rough wall-clock estimate of a plan, before running it (``fwbench list``, the start of ``run``).

Per cell: a worker's start-up (interpreter and framework import, measured on a 2-core machine),
building the weights, the mode's compile time, the first call, warm-up, timing (bounded by the
protocol), and the parity check (which compiles again at the small parity shape). Call times come
from the model's FLOPs at a nominal throughput, so the estimate is an order of magnitude, not a
prediction: it is labelled as such wherever it is shown. Nothing here imports a framework.
"""

from __future__ import annotations

from pathlib import Path

from fwbench.datasets.images import read_labels
from fwbench.frameworks import runtimes  # the registry: no framework is imported
from fwbench.measure.timer import HF2019_NUMBER, HF2019_REPEAT, MIN_ADAPTIVE_SAMPLES
from fwbench.models import get_model
from fwbench.spec import Case, Plan, Settings

# A runtime's start-up and compile seconds are in its registry record (RuntimeInfo.startup_s, .compile_s);
# these are for a runtime that is not registered here (a stored plan's plugin runtime that is not loaded).
DEFAULT_STARTUP_S = 2.0
DEFAULT_COMPILE_S = 0.0
NOMINAL_FLOPS_PER_S_PER_THREAD = 40e9  # fp32, a modern x86 core; real models reach less or more
BUILD_S_PER_PARAMETER = 3e-8  # seeded weights: generating and converting ~30 ns per parameter
PER_CALL_OVERHEAD_S = 5e-5  # a framework call on a tiny model
FIT_STEP_OVERHEAD_S = 1e-3  # phase fit: data loading, the API's callbacks and loss bookkeeping per step (MLP, 2 cores)
IMAGE_S = 5e-3  # phase data: decoding, cropping to 224 px and normalising one ~256 px JPEG on one core


def estimate_data_cell_s(case: Case, settings: Settings) -> float:
    """Seconds one phase data cell may take over its rounds: start-up, then the first, warm-up and timed
    batches at IMAGE_S per image (scaled by the crop's area) on min(workers, threads) cores."""
    startup_s, _ = startup_and_compile_s(case.runtime)
    parallel = max(1, min(case.workers or 0, settings.threads))
    batch_s = case.batch_size * IMAGE_S * (settings.crop / 224) ** 2 / parallel
    batches = 1 + max(settings.warmup_calls, 2 * (case.workers or 0)) + settings.data_batches
    return settings.rounds * (startup_s + batches * batch_s)


def estimate_call_s(case: Case, settings: Settings) -> float:
    """Seconds of one call of ``case`` at the nominal throughput."""
    flops = get_model(case.model).flops(case.batch_size, case.seq_len, case.phase)
    return PER_CALL_OVERHEAD_S + flops / (NOMINAL_FLOPS_PER_S_PER_THREAD * settings.threads)


def startup_and_compile_s(runtime: str) -> tuple[float, float]:
    """(seconds to start a worker and import the framework, seconds the mode compiles a small model in its
    first call), from the runtime's registry record."""
    info = runtimes().get(runtime)
    return (DEFAULT_STARTUP_S, DEFAULT_COMPILE_S) if info is None else (info.startup_s, info.compile_s)


def estimate_cell_s(case: Case, settings: Settings) -> float:
    """Seconds one cell may take, worker start-up to stored result, over its rounds: a fresh worker's start-up,
    build, compile (twice: once more at the parity shape) and warm-up per round, and the timing budget (shared by
    the rounds; interleaved, the pauses between workers' blocks add to it)."""
    if case.phase == "data":
        return estimate_data_cell_s(case, settings)
    startup_s, compile_s = startup_and_compile_s(case.runtime)
    call = estimate_call_s(case, settings)
    rounds = settings.rounds
    if settings.protocol == "hf2019":
        timing = HF2019_REPEAT * HF2019_NUMBER * call
    else:
        timing = min(settings.max_time_s, max(MIN_ADAPTIVE_SAMPLES * max(call, settings.min_block_s), 2 * call))
    build = BUILD_S_PER_PARAMETER * get_model(case.model).parameter_count()
    if case.phase == "fit":  # epochs × steps, each step its FLOPs plus a training loop's per-step cost
        samples, decode_s = settings.fit_samples, 0.0
        if settings.fit_source == "input" and settings.data_input is not None:  # + decoding every image, 1 core
            try:
                samples = len(read_labels(Path(settings.data_input)))
            except OSError:
                pass
            decode_s = samples * IMAGE_S
        steps = settings.epochs * (samples // case.batch_size)
        timing = steps * (call + FIT_STEP_OVERHEAD_S) + settings.epochs * decode_s
        return rounds * (startup_s + build + 2 * compile_s + timing)
    fixed = startup_s + build + 2 * compile_s + (1 + max(2, settings.warmup_calls)) * call
    if settings.interleave:
        timing *= 1 + settings.settle_s / max(settings.min_block_s, call)
    return rounds * fixed + timing


def estimate_plan_s(plan: Plan) -> float:
    """Seconds the plan's runnable cells may take in all (skipped cells cost nothing)."""
    return sum(estimate_cell_s(case, plan.settings) for case in plan.cases)


def format_estimate(seconds: float) -> str:
    """``~40 s``, ``~12 min``, ``~2.5 h``: one significant-looking figure, an order of magnitude."""
    if seconds < 90:
        return f"~{seconds:.0f} s"
    if seconds < 5400:
        return f"~{seconds / 60:.0f} min"
    return f"~{seconds / 3600:.1f} h"

"""The achieved rate of a profile's matmul/conv category: the model's matmul and convolution FLOPs of one call (those
the benchmark's GFLOP/s counts: :meth:`fwbench.models.base.ModelDescription.forward_flops`, attention's two matmuls
included) over the category's self time per profiled call, as GFLOP/s and as a share of the machine's measured gemm
peak (``fwbench env --peak``). Only for inference profiles split by op: a compiled program the profiler cannot see
into has no category time to divide by."""

from __future__ import annotations

from dataclasses import dataclass

from fwbench.models import get_model
from fwbench.profile.categories import Category
from fwbench.profile.cells import ProfiledCell
from fwbench.profile.summary import NEGLIGIBLE_S
from fwbench.report.peak import GIGA, Peak
from fwbench.spec import SpecError
from fwbench.units import format_fraction, format_gflops

RATED_CATEGORY: Category = "matmul/conv"
BY_OP = "by op"  # fwbench.profile.cells.attribution of a profile whose ops the profiler saw
FUSED_SHARE = 0.1  # compiled fusions above this share of the busy time may hide matmuls: no rate
ABOVE_PEAK = 1.05  # a rate this far above the measured peak is not a rate (the peak's own noise is within it)


@dataclass(frozen=True)
class CategoryRate:
    """``gflops`` (1e9 FLOP per second of the category's self time) and its share of the peak (None: no comparable
    peak measured)."""

    gflops: float
    peak_fraction: float | None

    @property
    def above_peak(self) -> bool:
        """Faster than the machine's measured peak: the category's op time does not hold all of its work (an XLA
        thunk that hands its convolution to a thread pool ends before the work does)."""
        return self.peak_fraction is not None and self.peak_fraction > ABOVE_PEAK

    def text(self) -> str:
        """``171 GFLOP/s (35.2% of peak)``; a rate above the peak says it cannot be one."""
        share = f" ({format_fraction(self.peak_fraction)} of peak)" if self.peak_fraction is not None else ""
        warning = ": above the peak, so the ops' time does not hold all their work" if self.above_peak else ""
        return f"{format_gflops(self.gflops)} GFLOP/s{share}{warning}"


@dataclass(frozen=True)
class ModelFlops:
    """A model's matmul and convolution FLOPs of one inference call at one shape (``total``, what the benchmark's
    GFLOP/s counts) and the part of them in attention's two batched matmuls (``attention``)."""

    total: int
    attention: int = 0


def matmul_flops(model: str, phase: str, batch_size: int, seq_len: int | None) -> ModelFlops | None:
    """The model's matmul and convolution FLOPs of one inference call at this shape; None for another phase or a
    model this installation does not know."""
    if phase != "inference":
        return None
    try:
        description = get_model(model)
        total = description.forward_flops(batch_size, seq_len)
    except SpecError:
        return None
    return ModelFlops(total, description.attention_flops(batch_size, seq_len)) if total else None


def comparable_peak(peak: Peak | None, dtype: str, device: str, threads: int | None) -> Peak | None:
    """``peak`` when it was measured for this dtype, device and thread count (``threads`` None: not known, not
    checked); an fp32 2-thread peak says nothing of a bf16 or 1-thread profile."""
    if peak is None or (peak.dtype, peak.device) != (dtype, device):
        return None
    return None if threads is not None and peak.threads is not None and threads != peak.threads else peak


def fused_attention(cell: ProfiledCell) -> bool:
    """Whether the runtime ran attention as one fused op (torch's ``scaled_dot_product_attention`` kernels): its two
    matmuls are then in the attention/softmax category's time, not in matmul/conv's."""
    return any(op.category == "attention/softmax" and "attention" in op.name.lower() for op in cell.summary.ops)


def unrated_reason(cell: ProfiledCell) -> str | None:
    """Why ``cell``'s matmul/conv time cannot be divided into its FLOPs, or None: a profile not split by op, or one
    where compiled fusions (which may hold dots: XLA's, inductor's) take more than FUSED_SHARE of the busy time."""
    if cell.attribution != BY_OP:
        return cell.attribution
    fused = cell.summary.categories_s["compiled fusion"]
    if cell.summary.busy_s > 0 and fused > FUSED_SHARE * cell.summary.busy_s:
        return f"compiled fusions hold {fused / cell.summary.busy_s:.0%} of the ops' time, and may hold matmuls"
    return None


def category_rate(cell: ProfiledCell, flops: ModelFlops | None, peak: Peak | None) -> CategoryRate | None:
    """The matmul/conv rate of ``cell``: the model's matmul and convolution FLOPs (without attention's two matmuls
    where the runtime fused attention into one op, whose time is in attention/softmax) over the category's self
    time; None without FLOPs, without time in the category, or when :func:`unrated_reason` gives a reason."""
    seconds = cell.summary.categories_s[RATED_CATEGORY]
    if flops is None or seconds < NEGLIGIBLE_S or unrated_reason(cell) is not None:
        return None
    counted = flops.total - (flops.attention if fused_attention(cell) else 0)
    gflops = counted / seconds / GIGA
    return CategoryRate(gflops, gflops / peak.gflops if peak is not None else None)


def rate_legend(flops: ModelFlops | None, peak: Peak | None) -> str:
    """What the matmul/conv rate divides, and which peak its share is of."""
    if flops is None:
        return f"{RATED_CATEGORY} rate: none (no FLOP count for this model and phase)"
    fused = f" (less attention's {flops.attention / GIGA:.3g} where a runtime fused attention into one op)"
    text = (
        f"{RATED_CATEGORY} rate: the model's {flops.total / GIGA:.3g} GFLOP of matmuls and convolutions a call"
        f"{fused if flops.attention else ''} over the category's self time per profiled call, where the profiler "
        "split the call by op"
    )
    if peak is None:
        return text + "; no comparable gemm peak stored (fwbench env --peak measures it)"
    return (
        text
        + f"; % of the {peak.gflops:.0f} GFLOP/s gemm peak ({peak.runtime}, threads {peak.threads}, run {peak.run_id})"
    )

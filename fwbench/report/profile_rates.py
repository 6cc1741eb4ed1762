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
from fwbench.report.peak import GIGA, Peak
from fwbench.spec import SpecError
from fwbench.units import format_fraction, format_gflops

RATED_CATEGORY: Category = "matmul/conv"
NEGLIGIBLE_S = 1e-9
BY_OP = "by op"  # fwbench.profile.cells.attribution of a profile whose ops the profiler saw
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


def matmul_flops(model: str, phase: str, batch_size: int, seq_len: int | None) -> int | None:
    """The model's matmul and convolution FLOPs of one inference call at this shape; None for another phase or a
    model this installation does not know."""
    if phase != "inference":
        return None
    try:
        return get_model(model).forward_flops(batch_size, seq_len) or None
    except SpecError:
        return None


def comparable_peak(peak: Peak | None, dtype: str, device: str, threads: int | None) -> Peak | None:
    """``peak`` when it was measured for this dtype, device and thread count (``threads`` None: not known, not
    checked); an fp32 2-thread peak says nothing of a bf16 or 1-thread profile."""
    if peak is None or (peak.dtype, peak.device) != (dtype, device):
        return None
    return None if threads is not None and peak.threads is not None and threads != peak.threads else peak


def category_rate(cell: ProfiledCell, flops: int | None, peak: Peak | None) -> CategoryRate | None:
    """The matmul/conv rate of ``cell`` given the model's ``flops`` per call; None without FLOPs, without time in the
    category, or when the profile is not split by op."""
    seconds = cell.summary.categories_s[RATED_CATEGORY]
    if not flops or seconds < NEGLIGIBLE_S or cell.attribution != BY_OP:
        return None
    gflops = flops / seconds / GIGA
    return CategoryRate(gflops, gflops / peak.gflops if peak is not None else None)

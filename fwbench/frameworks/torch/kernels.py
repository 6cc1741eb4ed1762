"""The kernel libraries a torch cell ran (``details.kernels``, :meth:`fwbench.frameworks.base.Backend.kernel_libraries`):
one more call of the timed step with oneMKL's and oneDNN's verbose modes switched on at run time
(``torch.backends.mkl.verbose``, ``torch.backends.mkldnn.verbose``), their lines captured from file descriptor 1 and
parsed; ATen's own vectorised kernels as ``torch.backends.cpu.get_cpu_capability()`` reports them; torch.compile and
AOTInductor's generated C++ as inductor's ``pick_vec_isa()`` reports it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from fwbench.frameworks.kernel_reports import captured_stdout, kernel_entry, not_reported_entry, parse_mkl, parse_onednn

ATEN_SOURCE = "torch.backends.cpu.get_cpu_capability()"
INDUCTOR_SOURCE = "torch._inductor.cpu_vec_isa.pick_vec_isa()"


def verbose_report(step: Callable[[], object]) -> str:
    """What oneMKL and oneDNN print in one call of ``step`` with their verbose modes on (off again after it); a
    library this torch build lacks (no MKL on aarch64 or macOS) is left out."""
    with captured_stdout() as captured, contextlib.ExitStack() as stack:
        if torch.backends.mkl.is_available():
            stack.enter_context(torch.backends.mkl.verbose(torch.backends.mkl.VERBOSE_ON))
        if torch.backends.mkldnn.is_available():
            stack.enter_context(torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON))
        step()
    return captured.text


def aten_entry() -> dict[str, Any]:
    """ATen's own CPU kernels (what is not handed to oneMKL or oneDNN: element-wise ops, reductions, softmax, norms):
    the ISA its dispatcher picked."""
    return kernel_entry(
        "ATen",
        version=torch.__version__,
        isa=torch.backends.cpu.get_cpu_capability(),
        ops=("vectorised CPU kernels",),
        source=ATEN_SOURCE,
    )


def inductor_entry() -> dict[str, Any]:
    """torch.compile's (and AOTInductor's) generated C++ kernels: the vector ISA inductor compiles them for."""
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    picked = pick_vec_isa()
    isa = str(picked) if picked else None
    return kernel_entry(
        "Inductor C++",
        version=torch.__version__,
        isa=isa,
        ops=("generated kernels",),
        source=INDUCTOR_SOURCE,
        not_reported=None if isa else "inductor picked no vector ISA (scalar C++)",
        arch_flags=picked.build_arch_flags() if picked else None,  # the compiler flags it builds the kernels with
    )


def kernel_libraries(step: Callable[[], object], mode: str, device: str) -> list[dict[str, Any]]:
    """``details.kernels`` of a torch cell on ``device`` whose timed call is ``step`` in ``mode``."""
    if device != "cpu":
        return [not_reported_entry(f"the probe reads CPU libraries' reports; this cell ran on {device}")]
    text = verbose_report(step)
    entries = parse_mkl(text) + parse_onednn(text)
    if mode in ("compile", "export"):
        entries.append(inductor_entry())
    entries.append(aten_entry())
    return entries

"""Which kernel libraries ran a cell's heavy ops, and on which instruction set, as the libraries themselves report it
(``details.kernels``, recorded by :meth:`fwbench.frameworks.base.Backend.kernel_libraries`). Framework-free: the
entries' shape (:func:`kernel_entry`), capturing what verbose C libraries write to file descriptor 1
(:func:`captured_stdout`), and the parsers of their reports: oneDNN's verbose lines, oneMKL's ``MKL_VERBOSE`` lines,
an XLA HLO module's text, OpenVINO's ``primitiveType`` names. Nothing here reads the CPU's own flags: an ISA is
only ever what a library said it dispatched to.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import re
import sys
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

ONEDNN_SOURCE = "oneDNN verbose"
# An entry's key for the environment variables that make its library report when they are set at the worker's start
# (TensorFlow's oneDNN): ``fwbench explain`` starts a probe cell with them.
VERBOSE_ENVIRONMENT = "verbose_environment"
MKL_SOURCE = "MKL_VERBOSE"
HLO_SOURCE = "compiled HLO"
# A oneDNN implementation's or an OpenVINO primitive's ISA token (oneDNN's cpu_isa_t names, OpenVINO's impl types):
# "jit:avx512_core" → avx512_core; "jit:uni", "gemm:jit", "ref:any", "simple:any" name none.
_ISA = re.compile(r"^(sse\d+|avx(2|512|10)?(_\w+)?|amx(_\w+)?|asimd|sve(_\w+)?|neon)$")
# the tokens that qualify an ISA in OpenVINO's primitive names (avx512_core_amx, avx2_vnni …)
_ISA_QUALIFIERS = frozenset({"core", "amx", "vnni", "bf16", "fp16", "int8", "2", "vl", "bw", "dq"})
# oneDNN primitives that move data rather than compute (left out of a library's ops).
_ONEDNN_DATA_MOVES = frozenset({"reorder", "concat", "sum", "shuffle"})


def kernel_entry(
    library: str | None,
    *,
    version: str | None,
    isa: str | None,
    ops: Iterable[str],
    source: str | None,
    not_reported: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """One ``details.kernels`` entry: a library, its version, the ISA it said it ran on, the op kinds it ran (sorted,
    unique) and where these facts came from; ``not_reported`` (why) is required when ``isa`` or ``version`` is None."""
    if (isa is None or version is None) and not not_reported:
        raise ValueError(f"{library}: an entry without an ISA or a version must say why (not_reported)")
    entry: dict[str, Any] = {
        "library": library,
        "version": version,
        "isa": isa,
        "ops": sorted(set(ops)),
        "source": source,
        **extra,
    }
    if not_reported:
        entry["not_reported"] = not_reported
    return entry


def not_reported_entry(reason: str, library: str | None = None, source: str | None = None) -> dict[str, Any]:
    """An entry saying only why nothing (or only ``library``) is known."""
    return kernel_entry(library, version=None, isa=None, ops=(), source=source, not_reported=reason)


def probe_failure(exc: BaseException) -> list[dict[str, Any]]:
    """``details.kernels`` of a probe that raised: the cell is kept, the entry says what failed."""
    return [not_reported_entry(f"the probe failed: {type(exc).__name__}: {exc}".strip().rstrip(":"))]


def is_isa(token: str) -> bool:
    """Whether ``token`` names an instruction set as oneDNN and OpenVINO spell them (avx2, avx512_core, amx …)."""
    return bool(_ISA.match(token))


@dataclass
class Captured:
    """What was written to file descriptor 1 inside :func:`captured_stdout` (set when the block is left)."""

    text: str = ""


def _flush_c_stdio() -> None:
    """Flush the C library's stdio buffers (verbose C libraries printf into them; fd 1 is not a terminal)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).fflush(None)


@contextlib.contextmanager
def captured_stdout() -> Iterator[Captured]:
    """Everything written to file descriptor 1 inside the block (C libraries and Python alike) goes to a temporary
    file instead, read into the yielded :class:`Captured` when the block is left; fd 1 is restored in any case."""
    sys.stdout.flush()
    _flush_c_stdio()
    captured = Captured()
    saved = os.dup(1)
    try:
        with tempfile.TemporaryFile() as sink:
            os.dup2(sink.fileno(), 1)
            try:
                yield captured
            finally:
                with contextlib.suppress(ValueError, OSError):
                    sys.stdout.flush()
                _flush_c_stdio()
                os.dup2(saved, 1)
                sink.seek(0)
                captured.text = sink.read().decode(errors="replace")
    finally:
        os.close(saved)


# -- oneDNN -------------------------------------------------------------------------------------------------------
@dataclass
class _OneDnnReport:
    """What oneDNN's verbose lines said: its version, the most it may dispatch to, and per ISA token (None: the
    implementation names none) the compute primitives' kinds and implementations."""

    version: str | None = None
    max_isa: str | None = None
    by_isa: dict[str | None, tuple[set[str], set[str]]] = dataclasses.field(default_factory=dict)

    def read(self, fields: list[str]) -> None:
        """One verbose line, split at its commas."""
        line = ",".join(fields)
        if "info" in fields[:3]:
            found = re.search(r"\boneDNN v(\d+\.\d+(?:\.\d+)?)", line)
            self.version = found.group(1) if found else self.version
            isa = [field.removeprefix("isa:").strip() for field in fields if field.startswith("isa:")]
            self.max_isa = isa[0] if isa else self.max_isa
        offset = 1 if fields[1].startswith("v") and fields[1][1:].isdigit() else 0  # "v1": the line format's version
        if len(fields) < offset + 6 or fields[offset + 1 : offset + 3] != ["primitive", "exec"]:
            return
        kind, implementation = fields[offset + 4], fields[offset + 5]
        if kind in _ONEDNN_DATA_MOVES:
            return
        token = implementation.rsplit(":", 1)[-1]
        ops, implementations = self.by_isa.setdefault(token if is_isa(token) else None, (set(), set()))
        ops.add(kind)
        implementations.add(implementation)


def parse_onednn(text: str) -> list[dict[str, Any]]:
    """oneDNN's verbose lines in ``text`` → one entry per ISA its compute primitives ran on (their kinds as ``ops``,
    their implementations as ``implementations``); ``max_isa`` is oneDNN's ``info,cpu,isa:`` line (the most it may
    dispatch to), the version its ``info,oneDNN vX.Y.Z`` line. Data moves (reorders) are left out; [] when no
    compute primitive ran."""
    report = _OneDnnReport()
    for line in text.splitlines():
        if line.startswith(("onednn_verbose,", "dnnl_verbose,")):
            report.read(line.split(","))
    entries = []
    for isa, (ops, implementations) in report.by_isa.items():
        reasons = []
        if isa is None:
            reasons.append(f"the implementations {', '.join(sorted(implementations))} name no ISA")
        if report.version is None:
            reasons.append("oneDNN printed no version line in the probe (printed once per process, earlier)")
        entries.append(
            kernel_entry(
                "oneDNN",
                version=report.version,
                isa=isa,
                ops=ops,
                source=ONEDNN_SOURCE,
                not_reported="; ".join(reasons) or None,
                implementations=sorted(implementations),
                max_isa=report.max_isa,
            )
        )
    return entries


# -- oneMKL -------------------------------------------------------------------------------------------------------
_MKL_HEADER = re.compile(r"^MKL_VERBOSE (?:oneMKL|Intel\(R\) MKL) (?P<version>.+?) Product build \S+ for (?P<rest>.*)$")
_MKL_CALL = re.compile(r"^MKL_VERBOSE (?P<function>[A-Z][A-Z0-9_]*)\(")


def parse_mkl(text: str) -> list[dict[str, Any]]:
    """oneMKL's ``MKL_VERBOSE`` lines in ``text`` → one entry (the functions called as ``ops``), or [] when no
    function was called. The version and the code path come from its header line: ``… for Intel(R) 64 architecture
    <code path>, Lnx …``, where the code path is MKL's own wording (e.g. "Intel(R) Architecture processors": its
    generic path; "Intel(R) Advanced Vector Extensions 512 (Intel(R) AVX-512) enabled processors")."""
    version: str | None = None
    isa: str | None = None
    functions: set[str] = set()
    for line in text.splitlines():
        header = _MKL_HEADER.match(line)
        if header:
            version = header.group("version").strip()
            rest = header.group("rest").split(",", 1)[0]
            isa = rest.split(" architecture ", 1)[1].strip() if " architecture " in rest else rest.strip() or None
            continue
        call = _MKL_CALL.match(line)
        if call:
            functions.add(call.group("function"))
    if not functions:
        return []
    reason = None if version and isa else "MKL printed no header line in the probe (printed once per process, earlier)"
    return [kernel_entry("oneMKL", version=version, isa=isa, ops=functions, source=MKL_SOURCE, not_reported=reason)]


# -- XLA ----------------------------------------------------------------------------------------------------------
_HLO_COMPUTATION = re.compile(r"^(?:ENTRY )?%?(?P<name>[\w.\-]+) \(.*\) -> .*\{\s*$")
_HLO_OPCODE = re.compile(r"=\s.*?\b(?P<opcode>[a-z][a-z0-9\-]*)\(")
_HLO_CALLS = re.compile(r"calls=%?(?P<name>[\w.\-]+)")
_HLO_FUSION_KIND = re.compile(r'"kind"\s*:\s*"(?P<kind>__\w+)"')
_HLO_CUSTOM_TARGET = re.compile(r'custom_call_target="(?P<target>[^"]+)"')
_HLO_HEAVY = {"dot": "matmul", "convolution": "convolution"}
# XLA:CPU's custom fusions and custom calls that hand work to a library, by the name XLA gives them
_HLO_LIBRARIES = {"__ynn_fusion": "YNNPACK", "__xnn_fusion": "XNNPACK", "__onednn": "oneDNN"}
XLA_ISA_REASON = (
    "XLA does not report the ISA its generated code or the libraries it calls were compiled or dispatched for"
)


def _hlo_library(line: str) -> str | None:
    """The library a fusion or custom call of an HLO line hands its work to, if any."""
    for pattern in (_HLO_FUSION_KIND, _HLO_CUSTOM_TARGET):
        found = pattern.search(line)
        if found:
            name = found.group(1)
            for prefix, library in _HLO_LIBRARIES.items():
                if name.startswith(prefix):
                    return library
    return None


def parse_hlo(text: str, version: str | None) -> list[dict[str, Any]]:
    """A compiled (optimised) HLO module's text → one entry per library that runs its dots and convolutions:
    those inside a computation called by a YNNPACK/XNNPACK custom fusion (or a oneDNN custom call) are that
    library's, the rest XLA:CPU's own (its emitted loops or its Eigen runtime calls). ``version``: the XLA build's
    (jaxlib's, TensorFlow's). No ISA: XLA reports none."""
    heavy: dict[str, set[str]] = {}  # computation → its heavy op kinds
    handed: dict[str, str] = {}  # computation → the library its caller hands it to
    direct: dict[str, set[str]] = {}  # library → op kinds of its custom calls
    computation = ""
    for line in text.splitlines():
        head = _HLO_COMPUTATION.match(line)
        if head:
            computation = head.group("name")
            continue
        opcode = _HLO_OPCODE.search(line)
        if opcode is None:
            continue
        op = opcode.group("opcode")
        library = _hlo_library(line)
        if op in _HLO_HEAVY:
            heavy.setdefault(computation, set()).add(_HLO_HEAVY[op])
        elif library is not None and op == "custom-call":
            target = _HLO_CUSTOM_TARGET.search(line)
            direct.setdefault(library, set()).add(target.group(1).split("$")[-1] if target else op)
        if library is not None:
            for called in _HLO_CALLS.findall(line):
                handed[called] = library
    ops = dict(direct)
    for name, kinds in heavy.items():
        ops.setdefault(handed.get(name, "XLA:CPU"), set()).update(kinds)
    reason = XLA_ISA_REASON + ("" if version else "; no version known for this XLA build")
    return [
        kernel_entry(library, version=version, isa=None, ops=kinds, source=HLO_SOURCE, not_reported=reason)
        for library, kinds in sorted(ops.items())
    ]


# -- OpenVINO -----------------------------------------------------------------------------------------------------
def parse_openvino_primitive(primitive: str) -> tuple[str, str | None, str] | None:
    """An OpenVINO CPU ``primitiveType`` (``<implementation>_<isa>_<precision>``, e.g. ``brgconv_avx512_f32``,
    ``gemm_mlas_f32``) → (library, ISA or None, implementation); None for ``unknown_*`` (no kernel: inputs,
    constants, reshapes)."""
    tokens = primitive.split("_")
    if len(tokens) < 2 or tokens[0] == "unknown":
        return None
    rest = tokens[:-1]  # the last token is the precision
    if "mlas" in rest:
        return "MLAS", None, "_".join(rest)
    if "acl" in rest:
        return "Arm Compute Library", None, "_".join(rest)
    for i, token in enumerate(rest):
        if is_isa(token):
            end = i + 1
            while end < len(rest) and (is_isa(rest[end]) or rest[end] in _ISA_QUALIFIERS):
                end += 1
            implementation = "_".join(rest[:i] + rest[end:]) or rest[0]  # e.g. brgconv_1x1: a variant, not an ISA
            return "OpenVINO CPU plugin", "_".join(rest[i:end]), implementation
    return "OpenVINO CPU plugin", None, "_".join(rest)


def parse_openvino(layers: Iterable[tuple[str, str]], version: str | None, source: str) -> list[dict[str, Any]]:
    """(layer type, primitiveType) of every layer of an OpenVINO runtime model → one entry per (library, ISA), the
    layer types as ``ops``, the implementations as ``implementations``."""
    groups: dict[tuple[str, str | None], tuple[set[str], set[str]]] = {}
    for layer_type, primitive in layers:
        parsed = parse_openvino_primitive(primitive)
        if parsed is None:
            continue
        library, isa, implementation = parsed
        ops, implementations = groups.setdefault((library, isa), (set(), set()))
        ops.add(layer_type)
        implementations.add(implementation)
    entries = []
    for (library, isa), (ops, implementations) in sorted(
        groups.items(), key=lambda item: (item[0][0], item[0][1] or "")
    ):
        reasons = []
        if isa is None:
            reasons.append(f"the primitive types ({', '.join(sorted(implementations))}) name no ISA")
        if version is None:
            reasons.append("no version known")
        entries.append(
            kernel_entry(
                library,
                version=version,
                isa=isa,
                ops=ops,
                source=source,
                not_reported="; ".join(reasons) or None,
                implementations=sorted(implementations),
            )
        )
    return entries

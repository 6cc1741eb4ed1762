"""What a cell's worker took to get going and showed doing it: ``details.compile_health`` (compile counters and
flags), ``details.stage_seconds`` (each stage's seconds, the stages up to the first result), an ahead-of-time
runtime's ``details.compile_report`` and the CPU's native bf16/int8 units the worker found."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from fwbench.details.parse import as_dict, as_float, as_int, as_str, each, set_fields, strs


@dataclass(frozen=True)
class CompileHealth:
    """``details.compile_health``: compile counters (recompiles, retraces, graph breaks, eager fallbacks) read
    after warm-up and after timing, and the flags a report shows. Empty for a cell that stored none."""

    flags: tuple[str, ...] = ()
    recompiled_in_timed_loop: bool = False
    during_timing: Mapping[str, int] = field(default_factory=dict)
    after_warmup: Mapping[str, int] = field(default_factory=dict)
    after_timing: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def measured(cls, before: Mapping[str, int], after: Mapping[str, int]) -> CompileHealth:
        """The counters read just before and just after the timed loop, and the flags a report shows: any counter
        that grew during the loop means it recompiled or retraced; graph breaks and eager fallbacks are flagged even
        when they came before it."""
        during = {key: after[key] - before.get(key, 0) for key in after}
        flags = [f"{key.replace('_', ' ')} +{n} in timed loop" for key, n in during.items() if n > 0]
        flags += [
            f"{key.replace('_', ' ')} {after[key]}"
            for key in ("graph_breaks", "eager_fallbacks")
            if after.get(key, 0) > 0 and during.get(key, 0) == 0
        ]
        return cls(tuple(flags), any(n > 0 for n in during.values()), during, dict(before), dict(after))

    def to_dict(self) -> dict[str, Any]:
        return {
            "after_warmup": dict(self.after_warmup),
            "after_timing": dict(self.after_timing),
            "during_timing": dict(self.during_timing),
            "recompiled_in_timed_loop": self.recompiled_in_timed_loop,
            "flags": list(self.flags),
        }

    @classmethod
    def parse(cls, raw: Any) -> CompileHealth:
        """The stored record; the empty one for a cell that stored none."""
        if not isinstance(raw, dict) or not raw:
            return NO_COMPILE_HEALTH

        def counters(key: str) -> dict[str, int]:
            return {str(k): v for k, v in as_dict(raw.get(key)).items() if as_int(v) is not None}

        return cls(
            flags=strs(raw.get("flags")) or (),
            recompiled_in_timed_loop=bool(raw.get("recompiled_in_timed_loop", False)),
            during_timing=counters("during_timing"),
            after_warmup=counters("after_warmup"),
            after_timing=counters("after_timing"),
        )


NO_COMPILE_HEALTH = CompileHealth()


# The worker's stages up to its first call's outputs (runner.messages.STAGES): the time to first result.
FIRST_RESULT_STAGES = ("start", "import", "build", "compile", "first_call")


@dataclass(frozen=True)
class StageSeconds:
    """``details.stage_seconds``: seconds the worker spent in each stage it entered (``runner.messages.STAGES``),
    by stage."""

    seconds: Mapping[str, float] = field(default_factory=dict)

    def get(self, stage: str) -> float | None:
        return self.seconds.get(stage)

    @property
    def first_result_s(self) -> float | None:
        """Seconds of the stages up to the first call's outputs (FIRST_RESULT_STAGES); None when the worker never
        finished its first call."""
        if "first_call" not in self.seconds:
            return None
        return sum(self.seconds.get(stage, 0.0) for stage in FIRST_RESULT_STAGES)

    def to_dict(self) -> dict[str, float]:
        return dict(self.seconds)

    @classmethod
    def parse(cls, raw: Any) -> StageSeconds | None:
        """The stages stored as ``raw`` (a stage whose seconds are not a number left out); None when not an object."""
        if not isinstance(raw, dict):
            return None
        return cls({str(stage): float(s) for stage, s in raw.items() if as_float(s) is not None})


@dataclass(frozen=True)
class CompileReport:
    """``details.compile_report`` of a runtime that compiles ahead of time (the deployment runtimes, torch:export;
    written by the backend's ``compile_report``): the export made for the timed shapes — its seconds (``cached``:
    the artefact came from the group's export cache, exported by another worker in ``export_s``), the engine's load
    seconds, the artefact's kind and size — the exports for other shapes made after it (``reexports``: the parity
    shape's), and what each runtime adds (``extra``: the input shapes, the exporter and opset, quantisation, the
    compiled precision, torch's AOT-compile seconds and package size, ...)."""

    export_s: float | None = None
    load_s: float | None = None
    cached: bool = False
    artefact: str | None = None
    artefact_bytes: int | None = None
    reexports: tuple[CompileReport, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """As ``frameworks.base.export_report`` writes it: the keys that are set (``cached`` only when true,
        ``reexports`` only when there are some), ``extra``'s beside them."""
        out = set_fields(self)
        out.pop("extra")
        if not self.cached:
            del out["cached"]
        if not self.reexports:
            del out["reexports"]
        return {**dict(self.extra), **out}

    @classmethod
    def parse(cls, raw: Any) -> CompileReport | None:
        """None for a cell that stored none (absent, or not a JSON object)."""
        if not isinstance(raw, dict):
            return None
        return cls(
            export_s=as_float(raw.get("export_s")),
            load_s=as_float(raw.get("load_s")),
            cached=bool(raw.get("cached")),
            artefact=as_str(raw.get("artefact")),
            artefact_bytes=as_int(raw.get("artefact_bytes")),
            reexports=each(cls.parse, raw.get("reexports")),
            extra={k: v for k, v in raw.items() if k not in _COMPILE_REPORT_KEYS},
        )


_COMPILE_REPORT_KEYS = frozenset(f.name for f in fields(CompileReport)) - {"extra"}


@dataclass(frozen=True)
class CpuUnits:
    """``details.cpu_bf16_units`` / ``cpu_int8_units``: of a bf16 (int8) CPU cell, the CPU's native bfloat16
    (int8) units the worker found (``fwbench.measure.environment``; empty: none, the dtype is emulated); None for
    other cells and rows stored before the units were recorded."""

    bf16: tuple[str, ...] | None = None
    int8: tuple[str, ...] | None = None

    def to_dict(self) -> dict[str, list[str]]:
        """The top-level details keys of the units found (none for a dtype not looked at)."""
        return {
            f"cpu_{name}_units": list(units)
            for name, units in (("bf16", self.bf16), ("int8", self.int8))
            if units is not None
        }

    @classmethod
    def from_details(cls, details: Mapping[str, Any]) -> CpuUnits:
        """From a row's whole ``details`` (the units are top-level keys); the empty record without them."""
        return cls(bf16=strs(details.get("cpu_bf16_units")), int8=strs(details.get("cpu_int8_units")))

"""A phase-generate cell (fwbench.runner.phases.generate): ``details.generation``, its rounds (one worker each) and
what its first generation compiled."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fwbench.details.parse import as_dict, as_float, as_int, each, floats


@dataclass(frozen=True)
class GenerationRound:
    """One round's figures (seconds, tokens per second): time to the first token and decode latency (medians and
    p90 over the timed generations), tokens per second of whole generations and of decode alone, the median decode
    latency at each position, the compiled decode loop's seconds per step (JAX; None elsewhere)."""

    ttft_p50_s: float | None = None
    decode_p50_s: float | None = None
    decode_p90_s: float | None = None
    tokens_per_s: float | None = None
    decode_tokens_per_s: float | None = None
    decode_step_s_by_position: tuple[float, ...] = ()
    loop_decode_step_s: float | None = None

    @classmethod
    def parse(cls, raw: Any) -> GenerationRound | None:
        if not isinstance(raw, dict):
            return None
        loop = as_dict(raw.get("compiled_loop"))
        return cls(
            ttft_p50_s=as_float(raw.get("ttft_p50_s")),
            decode_p50_s=as_float(raw.get("decode_p50_s")),
            decode_p90_s=as_float(raw.get("decode_p90_s")),
            tokens_per_s=as_float(raw.get("tokens_per_s")),
            decode_tokens_per_s=as_float(raw.get("decode_tokens_per_s")),
            decode_step_s_by_position=floats(raw.get("decode_step_s_by_position")) or (),
            loop_decode_step_s=as_float(loop.get("decode_step_s")),
        )


@dataclass(frozen=True)
class GenerationDetails:
    """``details.generation``: the prompt and new tokens, what a decode step reads and the prefill computes (the
    roofline's inputs), the compiles of the first generation by counter, and every round's figures (a cell stored
    from one round: that round)."""

    prompt_len: int | None = None
    new_tokens: int | None = None
    decode_step_bytes: float | None = None  # bytes a decode step reads at least, mean over the decode positions
    prefill_flops: int | None = None
    compiles_in_first_generation: tuple[tuple[str, int], ...] = ()
    rounds: tuple[GenerationRound, ...] = ()

    @classmethod
    def parse(cls, raw: Any) -> GenerationDetails | None:
        if not isinstance(raw, dict):
            return None
        compiles = as_dict(raw.get("compiles_in_first_generation"))
        rounds = each(GenerationRound.parse, raw.get("rounds")) or each(GenerationRound.parse, [raw])
        return cls(
            prompt_len=as_int(raw.get("prompt_len")),
            new_tokens=as_int(raw.get("new_tokens")),
            decode_step_bytes=as_float(raw.get("decode_step_bytes")),
            prefill_flops=as_int(raw.get("prefill_flops")),
            compiles_in_first_generation=tuple(
                (str(k), n) for k, v in compiles.items() if (n := as_int(v)) is not None
            ),
            rounds=rounds,
        )

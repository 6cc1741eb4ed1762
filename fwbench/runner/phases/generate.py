"""Phase generate: greedy decoding with a key/value cache (fwbench.models.generation says the algorithm). The timed call
is one whole generation of the cell's batch: one prefill call over the prompt (batch, prompt_len = the cell's
seq_len), then ``new_tokens - 1`` decode calls of (batch, 1), each waited for (the next call needs its token), each
timed on its own: the time to the first token (prefill), every decode step's latency by position, tokens per second.

Before timing, a first generation (the cell's first call, which compiles) keeps its tokens and every step's logits,
and counts the compiles it caused: a runtime that compiles per decode step is flagged in compile health. Interleaved,
each worker times BLOCKS_PER_ROUND blocks a round, each one generation (the adaptive calibration calls nothing: its
block is one generation, as the last warm-up one lasted). After timing, the last timed
generation must give the first one's tokens (a cache that keeps stale entries does not), and, with ``check_parity``,
the tokens and logits pass :func:`fwbench.models.generation.check_tokens` against the float64 reference (bf16: the
first step whose token differs and every step's error are reported, not judged).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from fwbench.frameworks import RuntimeInfo
from fwbench.models import get_model
from fwbench.models.base import ModelDescription
from fwbench.models.decoder import CausalDecoder
from fwbench.models.generation import check_tokens, generation_weights, prompt_ids, reference_logits
from fwbench.runner import estimate
from fwbench.runner.cell import Cell
from fwbench.runner.phases.base import Phase
from fwbench.runner.tolerances import parity_tolerance
from fwbench.spec import Case, Settings, SpecError

if TYPE_CHECKING:
    from fwbench.frameworks.base import Backend, Decoder, WholeGenerationDecoder


@dataclass
class GenerationTimes:
    """Every generation's seconds, in call order: its prefill (to the first token) and each decode step."""

    prefill_s: list[float] = field(default_factory=list)
    decode_s: list[list[float]] = field(default_factory=list)

    def last(self, calls: int) -> GenerationTimes:
        """The last ``calls`` generations' (the timed ones: the timer's calibration calls come before them)."""
        return GenerationTimes(self.prefill_s[-calls:] if calls else [], self.decode_s[-calls:] if calls else [])


@dataclass
class Generated:
    """One generation's outputs as numpy: tokens (batch, new_tokens) and, where kept, logits (batch, new_tokens,
    vocab)."""

    tokens: np.ndarray
    logits: np.ndarray | None = None


def generation_call(
    decoder: Decoder, prompt: Any, new_tokens: int, sync: Callable[[Any], None], times: GenerationTimes
) -> Callable[[], list[Any]]:
    """The timed call: one generation, its prefill's and each decode step's seconds appended to ``times``; returns
    the token tensors (not synchronised into numpy)."""
    perf_counter, prefill, decode = time.perf_counter, decoder.prefill, decoder.decode
    prompt_len = int(prompt.shape[1])

    def generate() -> list[Any]:
        steps: list[float] = []
        started = perf_counter()
        token, _ = prefill(prompt)
        sync(token)
        tokens = [token]
        last = perf_counter()
        times.prefill_s.append(last - started)
        for position in range(prompt_len, prompt_len + new_tokens - 1):
            token, _ = decode(token, position)
            sync(token)
            tokens.append(token)
            now = perf_counter()
            steps.append(now - last)
            last = now
        times.decode_s.append(steps)
        return tokens

    return generate


def whole_generation_call(
    decoder: WholeGenerationDecoder, prompt: Any, new_tokens: int, times: GenerationTimes
) -> Callable[[], np.ndarray]:
    """The timed call of a loop that generates a whole sequence in one call: one generation, its prefill's and decode
    steps' seconds as the loop's own clock measured them appended to ``times``; returns the tokens (batch,
    new_tokens)."""

    def generate() -> np.ndarray:
        generation = decoder.generate_whole(prompt, new_tokens)
        times.prefill_s.append(generation.prefill_s)
        times.decode_s.append(list(generation.decode_s))
        return generation.tokens

    return generate


def kept_generation(decoder: Decoder, prompt: Any, new_tokens: int) -> Generated:
    """One generation, untimed, keeping every step's logits."""
    token, logits = decoder.prefill(prompt)
    tokens, kept = [decoder.numpy(token)], [decoder.numpy(logits)]
    prompt_len = int(prompt.shape[1])
    for position in range(prompt_len, prompt_len + new_tokens - 1):
        token, logits = decoder.decode(token, position)
        tokens.append(decoder.numpy(token))
        kept.append(decoder.numpy(logits))
    return Generated(np.stack(tokens, axis=1), np.stack(kept, axis=1))


def percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def first_difference(a: np.ndarray, b: np.ndarray) -> int | None:
    """The first step (column) where the token arrays differ; None when equal."""
    if a.shape != b.shape:
        return 0
    columns = np.flatnonzero((a != b).any(axis=0))
    return int(columns[0]) if columns.size else None


class Generate(Phase):
    """build → cache and programs → a kept first generation (compiles counted) → first call → warm-up → timed
    generations → the tokens against the first generation's and the float64 reference's."""

    name = "generate"
    dtypes = ("fp32", "bf16")  # bf16: fwbench.precision's policy, float32 weights and cache; its tokens reported
    report_sections = ("generate",)

    def unsupported(self, description: ModelDescription, info: RuntimeInfo, settings: Settings) -> str | None:
        if not isinstance(description, CausalDecoder):
            return f"{description.name} is not a causal decoder (phase generate runs GPT-2 and the Llama layout)"
        return None

    def check_cell(self, case: Case, settings: Settings) -> None:
        description = get_model(case.model)
        if not isinstance(description, CausalDecoder):
            return  # refused as unsupported, with its reason
        if case.seq_len is None:
            raise SpecError("phase generate needs a prompt length (--prompt-lens)")
        positions = case.seq_len + settings.new_tokens
        if description.max_seq_len is not None and positions > description.max_seq_len:
            raise SpecError(
                f"a prompt of {case.seq_len} and {settings.new_tokens} new tokens need {positions} positions; "
                f"{case.model} has {description.max_seq_len}"
            )

    def flops_per_call(self, description: ModelDescription, case: Case, settings: Settings) -> int | None:
        """One generation: the prefill's forward over the prompt, then one forward of one position per further
        token (its attention over the cache, growing with the position, not counted)."""
        assert isinstance(description, CausalDecoder)
        prefill = description.prefill_flops(case.global_batch, case.seq_len or 1)
        return prefill + (settings.new_tokens - 1) * description.forward_flops(case.global_batch, 1)

    def estimate_cell_s(self, case: Case, settings: Settings) -> float:
        """:meth:`Phase.estimate_cell_s` with one call's overhead per decode step."""
        return super().estimate_cell_s(case, settings) + settings.new_tokens * estimate.PER_CALL_OVERHEAD_S

    def blocks_per_round(self, settings: Settings) -> int:
        """Interleaved: BLOCKS_PER_ROUND blocks a round, each of at least one whole generation (every one holds
        ``new_tokens - 1`` decode steps, each timed)."""
        return BLOCKS_PER_ROUND

    def merged_details(self, rounds: list[dict[str, Any]]) -> dict[str, Any]:
        """``generation`` of the first round, with every round's figures under ``rounds`` (fresh workers each)."""
        passes = [r["generation"] for r in rounds if isinstance(r.get("generation"), dict)]
        if not passes:
            return {}
        return {"generation": {**passes[0], "rounds": [{key: p.get(key) for key in ROUND_FIGURES} for p in passes]}}

    def seeded_weights(self, description: ModelDescription, seed: int) -> dict[str, np.ndarray]:
        """fwbench.models.generation.generation_weights: under the zoo's weights greedy tokens repeat."""
        assert isinstance(description, CausalDecoder)
        return generation_weights(description, seed)

    def measure(self, cell: Cell, backend: Backend, description: ModelDescription) -> None:
        case, settings = cell.job.case, cell.job.settings
        assert isinstance(description, CausalDecoder) and case.seq_len is not None
        new_tokens = settings.new_tokens
        prompt_array = prompt_ids(description, case.global_batch, case.seq_len, settings.seed)
        (prompt,) = backend.make_inputs({"input_ids": prompt_array})
        cell.stage("compile")
        batch, whole = case.global_batch, backend.whole_generations
        decoder = None if whole else backend.make_decoder(batch, case.seq_len, new_tokens)
        looper = backend.make_whole_decoder(batch, case.seq_len, new_tokens) if whole else None
        cell.stage("first_call")  # the kept generation, which compiles the programs: the cell's first call
        before = backend.compile_counters()
        started = time.perf_counter()
        times = GenerationTimes()
        generate: Callable[[], Any]
        if decoder is not None:
            kept = kept_generation(decoder, prompt, new_tokens)
            generate = generation_call(decoder, prompt, new_tokens, backend.sync, times)
        else:
            assert looper is not None
            kept = Generated(looper.generate_whole(prompt, new_tokens).tokens)  # no logits from such a loop
            generate = whole_generation_call(looper, prompt, new_tokens, times)
        first_generation_s = time.perf_counter() - started
        compiles = {key: value - before.get(key, 0) for key, value in backend.compile_counters().items()}
        cell.record_compile_report(backend)  # the deployment engines: the prefill's and the decode's export
        last_tokens: list[Any] = []

        def step() -> Any:
            tokens = generate()
            last_tokens[:] = [tokens]
            return tokens

        _, timing = cell.time_calls(backend, step, first_call_s=first_generation_s, one_call_per_block=True)
        timed = times.last(timing.total_calls)
        loop = None if decoder is None else self.compiled_loop(decoder, backend, prompt, kept, new_tokens, case.seq_len)
        self.record(cell, description, kept, timed, first_generation_s, compiles, loop)
        if "generation" in cell.result:  # every timed call: warm-up, calibration (none interleaved) and timed ones
            cell.result["generation"]["generations_called"] = len(times.prefill_s)
            if whole:
                cell.result["generation"]["timed_by"] = WHOLE_TIMED_BY
        if cell.result.get("status") != "ok":
            return
        if last_tokens:
            final = last_tokens[0] if decoder is None else np.stack([decoder.numpy(t) for t in last_tokens[0]], axis=1)
            differs = first_difference(final, kept.tokens)
            if differs is not None:
                cell.fail_check(f"the last timed generation's tokens differ from the first's from step {differs}")
                return
        if cell.job.check_parity:
            cell.stage("parity")
            self.check(cell, description, prompt_array, kept)
        cell.stage("done")

    def compiled_loop(
        self, decoder: Decoder, backend: Backend, prompt: Any, kept: Generated, new_tokens: int, prompt_len: int
    ) -> dict[str, Any] | None:
        """Where the runtime has one (:meth:`Decoder.decode_loop`): the decode steps as one compiled loop after one
        prefill, timed (its first call compiles, then ``LOOP_CALLS`` calls, each from the prefill's token: the cache's
        prompt positions are the prefill's, the later ones each loop writes before it reads them) after the per-step
        generations, its tokens checked against the kept generation's."""
        if new_tokens < 2:
            return None
        token, _ = decoder.prefill(prompt)
        started = time.perf_counter()
        tokens = decoder.decode_loop(token, prompt_len, new_tokens - 1)
        if tokens is None:
            return None
        backend.sync(tokens)
        first_s = time.perf_counter() - started
        seconds = []
        for _ in range(LOOP_CALLS):  # from the same prefill: the cache's prompt positions hold what it wrote
            started = time.perf_counter()
            tokens = decoder.decode_loop(token, prompt_len, new_tokens - 1)
            backend.sync(tokens)
            seconds.append(time.perf_counter() - started)
        differs = first_difference(decoder.numpy(tokens), kept.tokens[:, 1:])
        return {
            "what": f"the {new_tokens - 1} decode steps as one compiled loop (one call), after the same prefill",
            "first_call_s": first_s,
            "loop_s": seconds,
            "decode_step_s": float(np.median(seconds)) / (new_tokens - 1),
            "same_tokens": differs is None,
            "first_differing_step": None if differs is None else differs + 1,
        }

    def record(
        self,
        cell: Cell,
        description: CausalDecoder,
        kept: Generated,
        timed: GenerationTimes,
        first_generation_s: float,
        compiles: dict[str, int],
        loop: dict[str, Any] | None,
    ) -> None:
        """``details.generation`` (:func:`generation_record`); a decode step that compiled again is flagged in compile
        health; a compiled loop whose tokens differ fails the cell."""
        case, settings = cell.job.case, cell.job.settings
        cell.result["generation"] = generation_record(
            description, case, settings.new_tokens, kept.tokens, timed, first_generation_s, compiles, loop
        )
        flags = recompile_flags(compiles, settings.new_tokens)
        health = cell.result.get("compile_health")
        if flags and isinstance(health, dict):
            health.setdefault("flags", []).extend(flags)
            health["recompiled_per_decode_step"] = True
        if loop is not None and not loop["same_tokens"]:
            cell.fail_check(f"the compiled decode loop's tokens differ from step {loop['first_differing_step']}")

    def check(self, cell: Cell, description: CausalDecoder, prompt: np.ndarray, kept: Generated) -> None:
        """The kept generation's tokens and logits (where the runtime gives them) against the float64 reference
        (:func:`token_parity`); a failed check makes the cell ``mismatch`` naming its step."""
        parity, reason = token_parity(
            description, cell.weights(description), prompt, kept.tokens, kept.logits, cell.job.case.dtype
        )
        cell.result["parity"] = parity
        if reason is not None:
            cell.fail_check(reason)


def generation_record(
    description: CausalDecoder,
    case: Case,
    new_tokens: int,
    tokens: np.ndarray,
    timed: GenerationTimes,
    first_generation_s: float,
    compiles: dict[str, int],
    loop: dict[str, Any] | None,
) -> dict[str, Any]:
    """``details.generation``: the timed generations' time to first token and decode latency by position, tokens
    per second, the compiles of the first generation, the compiled loop's timing where there is one, the first
    generation's ``tokens`` (batch, new_tokens) where few enough."""
    batch, prompt_len = case.global_batch, case.seq_len or 0
    steps = [s for generation in timed.decode_s for s in generation]
    positions = range(prompt_len, prompt_len + new_tokens - 1)
    step_bytes = [description.decode_step_bytes(batch, p) for p in positions]
    by_position = [float(np.median(column)) for column in zip(*timed.decode_s, strict=True)]
    totals = [p + sum(d) for p, d in zip(timed.prefill_s, timed.decode_s, strict=True)]
    median_total = float(np.median(totals)) if totals else None
    return {
        "prompt_len": case.seq_len,
        "new_tokens": new_tokens,
        "batch": batch,
        "max_len": prompt_len + new_tokens,
        "timed_generations": len(totals),
        "ttft_s": timed.prefill_s,
        "ttft_p50_s": percentile(timed.prefill_s, 50),
        "decode_p50_s": percentile(steps, 50),
        "decode_p90_s": percentile(steps, 90),
        "decode_step_s_by_position": by_position,  # median over the timed generations, positions P .. P+N-2
        "tokens_per_s": None if not median_total else batch * new_tokens / median_total,
        "decode_tokens_per_s": None if not steps else batch / float(np.median(steps)),
        "first_generation_s": first_generation_s,
        # the roofline's inputs: bytes a decode step reads at least (mean over the decode positions), the prefill's
        # FLOPs
        "decode_step_bytes": float(np.mean(step_bytes)) if step_bytes else None,
        "prefill_flops": description.prefill_flops(batch, prompt_len),
        "compiles_in_first_generation": compiles,
        "compiled_loop": loop,
        "tokens": tokens.tolist() if tokens.size <= MAX_STORED_TOKENS else None,
    }


def recompile_flags(compiles: dict[str, int], new_tokens: int) -> list[str]:
    """Compile health's flags for a first generation that compiled more than its two programs (prefill, decode):
    a decode step compiled again."""
    many = {key: n for key, n in compiles.items() if key in ("compiles", "traces") and n > 2}
    return [
        f"{key} +{n} in one generation of {new_tokens} tokens (decode recompiles per step)" for key, n in many.items()
    ]


def token_parity(
    description: CausalDecoder,
    weights: dict[str, np.ndarray],
    prompt: np.ndarray,
    tokens: np.ndarray,
    logits: np.ndarray | None,
    dtype: str,
) -> tuple[dict[str, Any], str | None]:
    """A generation's ``tokens`` (batch, steps) and ``logits`` (batch, steps, vocab; None: a loop that gives none,
    its tokens alone checked) against the float64 reference on their prefix (fwbench.models.generation.check_tokens;
    bf16: reported, not judged): (``details.parity``, the mismatch's reason naming its step, or None)."""
    reference = reference_logits(description, weights, prompt, tokens)
    tolerance = parity_tolerance(description.name, dtype)
    judged = dtype == "fp32"  # bf16: the first step whose token differs and each step's error, reported
    checked = check_tokens(tokens, logits, reference, tolerance, judged=judged)
    parity = {
        "ok": checked.ok,
        "reference": "numpy-float64",
        "tolerance_rel_l2": tolerance,
        "checked": ("every generated token and its logits" if logits is not None else "every generated token")
        + ", on the runtime's own prefix"
        + ("" if judged else " (reported, not judged: bf16)")
        + ("" if logits is not None else " (the loop gives no logits)"),
        "outputs": {
            "logits": {
                "rel_l2": max(checked.step_rel_l2, default=0.0),
                "max_abs": float(np.abs(logits.astype(np.float64) - reference).max()),
            }
        }
        if logits is not None
        else {},
        "tokens": checked.to_dict(),
    }
    if checked.ok:
        return parity, None
    first = checked.first_mismatch or {}
    row = "" if first.get("row") is None else f", row {first['row']}"
    return parity, f"generation step {first.get('step')}{row}: {first.get('why')}"


# details.generation.timed_by of a loop that generates a whole sequence per call
WHOLE_TIMED_BY = "the loop's own clock (time to the first token, then the gaps between tokens), one call a generation"
# What each round keeps (details.generation.rounds): its figures, for the reports' estimates over rounds.
ROUND_FIGURES = (
    "ttft_p50_s", "decode_p50_s", "decode_p90_s", "tokens_per_s", "decode_tokens_per_s", "decode_step_s_by_position",
    "compiled_loop",
)  # fmt: skip
# a batch-8 generation of a 124M model takes seconds here: 2 a round, 3 rounds, 6 generations of ~190 decode steps
BLOCKS_PER_ROUND = 2
LOOP_CALLS = 3  # timed calls of a runtime's compiled decode loop, after its first (compiling) one
MAX_STORED_TOKENS = 4096  # the first generation's tokens are stored when the batch × new tokens is at most this

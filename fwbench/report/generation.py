"""Phase generate's table: each runtime's time to the first token (prefill), decode latency per token (median and
p90), tokens per second (whole generations, and decode alone), the compiled decode loop's latency per token where
the runtime has one, the compiles its first generation made and the token check's near ties.

Each figure is the geometric mean over the cell's rounds (fresh workers) with a 95% interval (Student's t on the
logs) when there are at least 3, in parentheses (fwbench.report.round_figures)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.markup import escape

from fwbench.details import GenerationDetails
from fwbench.measure.rounds import Estimate
from fwbench.report.peak import Peak
from fwbench.report.round_figures import over_rounds, rate_text, seconds_text
from fwbench.store import ResultRecord

TITLE = "Text generation (greedy, key/value cache: one prefill, then one decode call per token)"
HEADERS = [
    "model", "runtime", "batch × prompt + new", "TTFT", "prefill % FLOP peak", "decode p50", "decode p90",
    "decode % bandwidth", "tokens/s", "loop / token", "compiles", "tokens",
]  # fmt: skip
RIGHT = frozenset(HEADERS[2:11])
LEGEND = (
    "Generation: batch rows × prompt tokens + new tokens; TTFT, the prefill call over the prompt up to its first "
    "token; decode p50 / p90, one decode call (batch, 1) against the cache, each waited for, over the timed "
    "generations' steps; prefill % FLOP peak: the prefill's FLOPs ÷ TTFT, a share of the machine's fp32 gemm peak; "
    "decode % bandwidth: the bytes a decode step reads at least (every weight once, the embedding's rows, the cache "
    "up to its position; float32) ÷ decode p50, a share of the copy bandwidth of the same cores (both from `fwbench "
    "env --peak` with the cell's threads; — without one): decode at batch 1 is bound by memory, not FLOPs; tokens/s: "
    "batch × new tokens ÷ a whole generation's median time; loop / token: the decode steps as one compiled loop "
    "(jax.lax.fori_loop), its time ÷ the steps; compiles: programs the first generation compiled (two: the prefill's "
    "and the decode's; more: a decode step recompiled); tokens: ✓ every token the float64 reference's argmax on its "
    "prefix (ties: steps whose two best logits an error within the tolerance could swap; other cell: the model and "
    "runtime's check ran in another cell of the run; bf16: the first step whose token is not the reference's argmax, "
    "reported, not judged; tokens only: the loop gives no logits, so its tokens alone were checked); †: a vendor "
    "loop that runs a whole generation per call (OpenVINO GenAI), its TTFT and steps timed by its own clock. "
    "Geometric mean over the cell's rounds (fresh workers), its 95% interval in parentheses "
    "with ≥ 3 rounds."
)


@dataclass(frozen=True)
class GenerationRow:
    """One generate cell and its figures over rounds (seconds; tokens per second)."""

    row: ResultRecord
    details: GenerationDetails
    ttft: Estimate | None
    decode_p50: Estimate | None
    decode_p90: Estimate | None
    tokens_per_s: Estimate | None
    loop_step: Estimate | None
    prefill_peak_share: float | None  # the prefill's FLOP rate over the machine's gemm peak
    decode_bandwidth_share: float | None  # a decode step's bytes per second over the machine's copy bandwidth


def shares(row: ResultRecord, details: GenerationDetails, ttft: Estimate | None, decode: Estimate | None,
           peak: Peak | None) -> tuple[float | None, float | None]:  # fmt: skip
    """(prefill FLOP rate ÷ gemm peak, decode bytes per second ÷ copy bandwidth); None where the peak was measured
    with other threads, dtype or device, or not at all."""
    if peak is None or (row.dtype, row.device, row.threads) != (peak.dtype, peak.device, peak.threads):
        return None, None
    flops = None
    if ttft is not None and details.prefill_flops:
        flops = details.prefill_flops / ttft.value / 1e9 / peak.gflops
    moved = None
    if decode is not None and details.decode_step_bytes and peak.bandwidth_bytes_per_s:
        moved = details.decode_step_bytes / decode.value / peak.bandwidth_bytes_per_s
    return flops, moved


def generation_rows(results: Sequence[ResultRecord], peak: Peak | None = None) -> list[GenerationRow]:
    """Every generate cell that measured (ok or mismatch), in stored order, its shares of ``peak`` where one fits."""
    out = []
    for row in results:
        details = row.generation
        if details is None or row.status not in ("ok", "mismatch"):
            continue
        rounds = details.rounds
        ttft, decode = over_rounds([r.ttft_p50_s for r in rounds]), over_rounds([r.decode_p50_s for r in rounds])
        prefill_share, decode_share = shares(row, details, ttft, decode, peak)
        out.append(
            GenerationRow(
                row=row,
                details=details,
                ttft=ttft,
                decode_p50=decode,
                decode_p90=over_rounds([r.decode_p90_s for r in rounds]),
                tokens_per_s=over_rounds([r.tokens_per_s for r in rounds]),
                loop_step=over_rounds([r.loop_decode_step_s for r in rounds]),
                prefill_peak_share=prefill_share,
                decode_bandwidth_share=decode_share,
            )
        )
    return out


def share_text(share: float | None) -> str:
    return "—" if share is None else f"{share:.0%}"


def tokens_text(row: ResultRecord) -> str:
    """✓ or ✗ from the cell's token check, with its near ties; "other cell" where the runtime's check ran in another
    cell of the run (parity is checked once per model and runtime); — unchecked."""
    parity = row.details.get("parity")
    tokens = parity.get("tokens") if isinstance(parity, dict) else None
    if not isinstance(tokens, dict):
        return "other cell" if "parity_checked_by" in row.details else "—"
    ties = tokens.get("near_ties") or []
    if not tokens.get("judged", True):  # bf16: reported, not judged
        differs = tokens.get("first_differing_step")
        return "same as fp64" if differs is None else f"differ from step {differs}"
    mark = ("✓" if tokens.get("ok") else "✗") + (" tokens only" if tokens.get("step_rel_l2") == [] else "")
    return f"{mark} {len(ties)} ties" if ties else mark


def generation_cells(item: GenerationRow, markup: bool = True) -> list[str]:
    """The table's cells of one row (``markup``: store strings escaped for rich)."""
    row, details = item.row, item.details
    text = escape if markup else str
    own_clock = isinstance(row.details.get("generation"), dict) and "timed_by" in row.details["generation"]
    runtime = text(row.runtime) + (" †" if own_clock else "") + (" (mismatch)" if row.status == "mismatch" else "")
    counts = dict(details.compiles_in_first_generation)
    compiles = str(counts.get("compiles", counts.get("traces", 0)) or "—")
    shape = f"{row.batch_size} × {details.prompt_len or row.seq_len} + {details.new_tokens}"
    return [
        text(row.model), runtime, shape, seconds_text(item.ttft), share_text(item.prefill_peak_share),
        seconds_text(item.decode_p50), seconds_text(item.decode_p90), share_text(item.decode_bandwidth_share),
        rate_text(item.tokens_per_s), seconds_text(item.loop_step), compiles, tokens_text(row),
    ]  # fmt: skip

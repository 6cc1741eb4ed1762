"""Throughput of stored cells: samples/s and, for models with a sequence axis, tokens/s.

One timed call processes ``batch_size`` samples (``batch_size × seq_len`` tokens; a distributed cell: its global
batch, every process's rows): one forward pass (phase inference), one optimizer step (phase training) or one batch out
of a loader (phase data); one generation (phase generate) adds ``batch_size × new_tokens`` tokens. Reports show it for
training, data and generate cells, where samples/s is the usual way to state their speed; TensorBoard gets it for
every cell.
"""

from __future__ import annotations

from fwbench.store import ResultRecord

THROUGHPUT_PHASES = ("training", "data", "generate")  # phases whose report rows show samples/s and tokens/s


def per_call(row: ResultRecord) -> tuple[int, int | None]:
    """(samples, tokens or None) one timed call of ``row`` processes; a generation: its sequences and the tokens it
    generated."""
    batch, seq = row.global_batch, row.seq_len
    if row.generation is not None and row.generation.new_tokens:
        return batch, batch * row.generation.new_tokens
    return batch, None if seq is None else batch * seq


def rates(row: ResultRecord, seconds: float | None) -> tuple[float | None, float | None]:
    """(samples/s, tokens/s or None) of calls of ``row`` that take ``seconds`` each."""
    if seconds is None or seconds <= 0:
        return None, None
    samples, tokens = per_call(row)
    return samples / seconds, None if tokens is None else tokens / seconds


def throughput(row: ResultRecord) -> tuple[float | None, float | None]:
    """(samples/s, tokens/s) at the median of an ``ok`` training, data or generate cell; (None, None) otherwise."""
    if row.status != "ok" or row.phase not in THROUGHPUT_PHASES:
        return None, None
    return rates(row, row.median_s)


def format_rate(value: float | None) -> str:
    """``'1.23k'``, ``'456'``, ``'12.3M'``: three significant digits with an SI prefix; ``—`` for None."""
    if value is None:
        return "—"
    for factor, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor * 0.9995:
            return f"{value / factor:.3g}{prefix}"
    return f"{value:.3g}"


def throughput_text(row: ResultRecord) -> str:
    """``'1.23k samples/s, 157k tokens/s'`` (tokens only for a sequence model); ``—`` when not shown."""
    samples, tokens = throughput(row)
    if samples is None:
        return "—"
    text = f"{format_rate(samples)} samples/s"
    return text if tokens is None else f"{text}, {format_rate(tokens)} tokens/s"

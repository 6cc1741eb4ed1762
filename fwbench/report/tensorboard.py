"""TensorBoard event files of stored cells, written with tensorboardX (no framework involved).

Layout: one TensorBoard run per model × runtime, ``DIR/<model>/<framework>_<mode>/`` (``DIR/run<ID>/...``
when one call writes several stored runs). Within a run, a cell's tags carry its phase and shape, so
each chart overlays the runtimes of one model at one shape:

- ``<phase>/loss/<shape>``: training only, the loss of every optimizer step the worker ran (step 0: the
  first call, before any update; then warm-up, the timer's calibration calls, the timed calls).
- ``<phase>/step_time_s/<shape>``: seconds per call of each timed sample (a sample is the mean of
  ``calls_per_sample`` calls); training: the first round's samples (the worker whose losses are logged), at the
  optimizer step of the sample's last call; inference: every round's, at the sample's index.
- ``<phase>/samples_per_s/<shape>`` and, for models with a sequence axis, ``<phase>/tokens_per_s/<shape>``:
  the same samples as throughput (batch size, or batch × sequence length, over the step time); phases
  inference and training only (a phase fit sample is an epoch: its time only).
- ``<phase>/settings/<shape>``: text (markdown) with the case, the run's settings and the cell's figures.

``<shape>`` is ``b<batch>[_s<seq>]_<dtype>_<device>``. Each cell has its own event file (suffix
``.fwbench-run<ID>-<phase>-<shape>``); writing a cell again replaces that file, so reruns of
``fwbench report --tensorboard`` do not duplicate points.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fwbench.report.peak import achieved_gflops
from fwbench.report.throughput import rates
from fwbench.spec import CASE_FIELDS
from fwbench.store import ResultRecord
from fwbench.units import format_bytes, format_seconds

# Phases where one timed call processes one batch (throughput = batch / seconds); a fit sample is an epoch.
RATED_PHASES = ("inference", "training", "data")


def _summary_writer() -> Any:
    """tensorboardX's SummaryWriter class. tensorboardX imports torch at import time when torch is
    installed (only to recognise its tensors); it is hidden meanwhile, so no framework is loaded here."""
    hidden = "torch" not in sys.modules
    if hidden:
        sys.modules["torch"] = None  # type: ignore[assignment]  # `import torch` raises ImportError
    try:
        from tensorboardX import SummaryWriter
    finally:
        if hidden and sys.modules.get("torch", 0) is None:
            del sys.modules["torch"]
    return SummaryWriter


def _part(value: object) -> str:
    """A store value made safe as a path part (``torch:eager`` → ``torch_eager``)."""
    return re.sub(r"[^A-Za-z0-9.-]+", "_", str(value)).strip("._") or "_"


def shape_label(row: ResultRecord) -> str:
    """``b4_fp32_cpu``, ``b8_s128_bf16_cuda``, ``b32_w2_fp32_cpu``, ``b8_s128_p2weak_fp32_cpu``: the part of a cell's tags that tells its shape apart."""
    seq = "" if row.seq_len is None else f"_s{row.seq_len}"
    seq += "" if row.workers is None else f"_w{row.workers}"
    seq += "" if row.procs is None else f"_p{row.procs}{row.scaling}"
    return f"b{row.batch_size}{seq}_{_part(row.dtype)}_{_part(row.device)}"


def run_dir(root: Path, row: ResultRecord, per_run: bool = False) -> Path:
    """``root/<model>/<framework>_<mode>`` (under ``root/run<ID>`` with ``per_run``)."""
    base = root / f"run{row.run_id}" if per_run else root
    return base / _part(row.model) / _part(row.runtime)


def tags(row: ResultRecord) -> dict[str, str]:
    """The tags of a cell by metric (``loss`` for training cells only, ``tokens_per_s`` for sequence models)."""
    phase, shape = _part(row.phase), shape_label(row)
    rated = row.phase in RATED_PHASES
    metrics = [
        *(["loss"] if _step_losses(row) is not None else []),
        "step_time_s",
        *(["samples_per_s"] if rated else []),
        *(["tokens_per_s"] if rated and row.seq_len is not None else []),
        "settings",
    ]
    return {metric: f"{phase}/{metric}/{shape}" for metric in metrics}


def _step_losses(row: ResultRecord) -> list[float] | None:
    losses = None if row.training is None else row.training.step_losses
    return None if losses is None else list(losses)


def timed_samples(row: ResultRecord) -> list[tuple[int, float]]:
    """(step, seconds per call) of each timed sample charted: training, the first round's samples (the worker
    whose step losses are stored) at the optimizer step of the sample's last call (0 is the first call);
    otherwise every sample at its index."""
    parts = None if row.training is None else row.training.step_loss_parts
    if parts is None:
        return list(enumerate(row.samples))
    samples = row.round_samples[0] if row.round_samples else []
    calls = int(row.calls_per_sample or 1)
    return [(parts.before_timed + (k + 1) * calls - 1, seconds) for k, seconds in enumerate(samples)]


def _table(pairs: Sequence[tuple[str, Any]]) -> str:
    body = "\n".join(f"| {key} | {str(value).replace('|', '/')} |" for key, value in pairs)
    return f"| key | value |\n|---|---|\n{body}"


def settings_text(row: ResultRecord, settings: dict[str, Any]) -> str:
    """Markdown: the case, the cell's figures, the run's settings, each a two-column table."""
    samples_s, tokens_s = rates(row, row.median_s)
    case = [(key, getattr(row, key)) for key in ("run_id", *CASE_FIELDS, "case_key")]
    gflops = achieved_gflops(row)
    figures: list[tuple[str, Any]] = [
        ("median per call", format_seconds(row.median_s)),
        ("95% CI", f"{format_seconds(row.ci_low_s)} – {format_seconds(row.ci_high_s)}"),
        ("samples", f"{row.n_samples} × {row.calls_per_sample} calls"),
        ("first call (compile included)", format_seconds(row.first_call_s)),
        ("samples/s at the median", "—" if samples_s is None else f"{samples_s:.4g}"),
        *([("tokens/s at the median", f"{tokens_s:.4g}")] if tokens_s is not None else []),
        ("GFLOP/s at the median", "—" if gflops is None else f"{gflops:.4g}"),
        ("peak RSS", format_bytes(row.peak_memory_bytes)),
        *([("allocator peak", format_bytes(row.allocator_peak_bytes))] if row.allocator_peak_bytes else []),
        ("versions", None if row.versions is None else dict(row.versions)),
    ]
    training = row.training
    if training is not None:
        parts = training.step_loss_parts
        figures += [
            ("optimizer", training.optimizer),
            ("first loss", training.first_loss),
            ("final loss", training.final_loss),
            ("steps by part", None if parts is None else parts.to_dict()),
        ]
    return "\n\n".join(
        [
            f"**case**\n\n{_table(case)}",
            f"**figures**\n\n{_table(figures)}",
            f"**run settings**\n\n{_table(sorted(settings.items()))}",
        ]
    )


def event_suffix(row: ResultRecord) -> str:
    """The event-file name suffix that identifies a cell within its run directory."""
    return f".fwbench-run{row.run_id}-{_part(row.phase)}-{shape_label(row)}"


def write_cell(root: Path, row: ResultRecord, settings: dict[str, Any], per_run: bool = False) -> Path | None:
    """Write one ``ok`` cell's scalars and settings text; returns its run directory (None: not ok, nothing
    written). A previous event file of the same cell is replaced. OSError when ``root`` cannot be written."""
    if row.status != "ok" or not row.samples:
        return None
    folder = run_dir(root, row, per_run)
    folder.mkdir(parents=True, exist_ok=True)
    suffix = event_suffix(row)
    for old in folder.glob(f"events.out.tfevents.*{suffix}"):
        old.unlink()
    names = tags(row)
    writer = _summary_writer()(str(folder), filename_suffix=suffix, max_queue=1000, flush_secs=3600)
    try:
        for step, loss in enumerate(_step_losses(row) or []):
            writer.add_scalar(names["loss"], loss, step)
        for step, seconds in timed_samples(row):
            samples_s, tokens_s = rates(row, seconds)
            writer.add_scalar(names["step_time_s"], seconds, step)
            if "samples_per_s" in names:
                writer.add_scalar(names["samples_per_s"], samples_s, step)
            if "tokens_per_s" in names:
                writer.add_scalar(names["tokens_per_s"], tokens_s, step)
        writer.add_text(names["settings"], settings_text(row, settings), 0)
    finally:
        writer.close()
    return folder


def write_results(
    root: Path, results: Sequence[ResultRecord], settings_by_run: dict[int, dict[str, Any]]
) -> list[Path]:
    """Write every ``ok`` cell of ``results``; several runs go under ``root/run<ID>/``. Returns the run
    directories written (each once)."""
    per_run = len({row.run_id for row in results}) > 1
    folders = [write_cell(root, row, settings_by_run.get(row.run_id, {}), per_run) for row in results]
    return list(dict.fromkeys(folder for folder in folders if folder is not None))

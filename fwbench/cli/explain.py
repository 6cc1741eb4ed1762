"""``fwbench explain MODEL --runtimes A,B``: why one runtime of a cell is slower than another. Both are profiled (as
``fwbench profile`` does: a fresh worker each, calls without and under the framework's profiler, stored in a profile
run), and the difference of their profiled calls is split into op categories, the time outside every op and the
overlap, largest first, with the matmul/conv rate on both sides and the kernel libraries each cell recorded. Levers —
another runtime of the same framework that moves the work elsewhere (a compiled mode, a deployment engine) — are
profiled as extra cells and shown measured beside their base runtime."""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.markup import escape

from fwbench import __version__
from fwbench.cli.common import DB_HELP, positive_int, terminate_on_sigterm
from fwbench.cli.profile import add_profiled_cell_flags, profile_cases
from fwbench.cli.run_plan import plan_choices
from fwbench.frameworks.kernel_reports import VERBOSE_ENVIRONMENT
from fwbench.measure import environment
from fwbench.messages import NO_PROFILER
from fwbench.report.explain import (
    Explanation,
    Lever,
    explain_table,
    headline,
    kernel_lines,
    levers_table,
    warning_lines,
)
from fwbench.report.kernels import kernel_entries
from fwbench.report.peak import Peak, latest_peak
from fwbench.report.profile_rates import (
    RATED_CATEGORY,
    ModelFlops,
    category_rate,
    comparable_peak,
    matmul_flops,
    rate_legend,
)
from fwbench.report.profile_table import group_title
from fwbench.report.table import make_console
from fwbench.runner.outcome import run_worker
from fwbench.runner.planner import resolve_plan
from fwbench.spec import DTYPES, Case, Plan, Settings, SpecError
from fwbench.store import DEFAULT_DB, ProfileRecord, Store

# The levers fwbench can show measured: per runtime, the runtimes of the same framework's model that move its work
# to other code — a compiled mode (inductor's generated kernels, XLA), a deployment engine running the same model's
# export (ONNX Runtime's MLAS).
LEVERS: Mapping[str, tuple[str, ...]] = {
    "torch:eager": ("torch:compile", "onnxruntime:torch"),
    "torch:script": ("torch:compile",),
    "tensorflow:eager": ("tensorflow:function",),
    "tensorflow:function": ("tensorflow:xla",),
    "keras:tensorflow": ("tensorflow:xla",),
    "keras:torch": ("torch:compile",),
}
DEFAULT_CALLS = 10  # profiled calls per runtime (and as many without the profiler): a profile of few calls is noisy
PROBE_MAX_TIME_S = 1.0  # a kernel probe cell's timing budget: its times are not kept, only its details.kernels
LEVER_MAX_TIME_S = 3.0  # a lever timed as a plain cell (no profiler): its timing budget


def add_parser(commands: Any) -> None:
    """Register ``explain`` on the subcommand parsers ``commands``."""
    parser = commands.add_parser(
        "explain",
        help="why one runtime is slower than another: the difference split by op category, with the matmul rates "
        "and the kernel libraries each ran",
        description="Profiles MODEL in runtimes A and B (and the levers: other runtimes of their frameworks that "
        "move the work elsewhere) at one shape, each in a fresh worker, and splits the difference of their "
        "profiled calls by op category, largest first, with the matmul/conv rate (GFLOP/s and share of the gemm peak "
        "fwbench env --peak stored) and the kernel libraries and instruction sets each reported. Descriptive: a "
        "verdict on a speed-up comes from fwbench run.",
    )
    parser.add_argument("model", help="a model name (see `fwbench list`)")
    parser.add_argument("--runtimes", required=True, help="two runtimes, A,B (framework:mode)")
    parser.add_argument("--batch-size", type=positive_int, default=1, help="default 1")
    parser.add_argument(
        "--seq-len", type=positive_int, default=128, help="default 128; ignored by models without a sequence"
    )
    parser.add_argument("--dtype", choices=DTYPES, default="fp32", help="default: fp32")
    add_profiled_cell_flags(parser, DEFAULT_CALLS)
    parser.add_argument(
        "--levers",
        default="auto",
        help="'auto' (default): the runtimes LEVERS lists for A and B (torch:eager → torch:compile, "
        "onnxruntime:torch; tensorflow:function → tensorflow:xla; …); 'none'; or comma-separated runtimes",
    )
    parser.add_argument("--db", default=DEFAULT_DB, help=f"{DB_HELP}; the profiles go into a run of kind 'profile'")


def chosen_runtimes(text: str) -> tuple[str, str]:
    """``A,B`` → (A, B); SpecError unless exactly two different runtimes."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if len(names) != 2 or names[0] == names[1]:
        raise SpecError(f"--runtimes takes two different runtimes, A,B; got {text!r}")
    return names[0], names[1]


def chosen_levers(text: str, runtimes: Sequence[str]) -> list[str]:
    """The lever runtimes ``--levers`` names (``auto``: LEVERS of each runtime), without the compared ones."""
    if text == "none":
        return []
    named = (
        [lever for runtime in runtimes for lever in LEVERS.get(runtime, ())]
        if text == "auto"
        else [name.strip() for name in text.split(",") if name.strip()]
    )
    return [name for name in dict.fromkeys(named) if name not in runtimes]


def levers_by_base(levers: Sequence[str], runtimes: tuple[str, str]) -> dict[str, list[str]]:
    """Each lever under the compared runtime whose LEVERS list it (a lever named on the command line that neither
    lists: under A)."""
    grouped: dict[str, list[str]] = {}
    for lever in levers:
        base = next((runtime for runtime in runtimes if lever in LEVERS.get(runtime, ())), runtimes[0])
        grouped.setdefault(base, []).append(lever)
    return grouped


def explain_plan(args: argparse.Namespace, runtimes: Sequence[str]) -> Plan:
    """One inference cell of ``args.model`` per runtime, at the asked shape, one worker each."""
    namespace = argparse.Namespace(
        models=args.model,
        runtimes=",".join(runtimes),
        batch_sizes=str(args.batch_size),
        seq_lens=str(args.seq_len),
        phase="inference",
        dtype=args.dtype,
        device="cpu",
        threads=args.threads,
        timeout=args.timeout,
    )
    return resolve_plan(plan_choices(namespace, {"rounds": 1}))


def case_of(plan: Plan, record: ProfileRecord) -> Case | None:
    """The planned case ``record`` was profiled for."""
    return next((case for case in plan.cases if case.key == record.case_key), None)


def briefly_timed(plan: Plan, seconds: float) -> Settings:
    """``plan``'s settings with a timing budget of at most ``seconds`` (an extra cell: a probe, a plain lever)."""
    return dataclasses.replace(plan.settings, max_time_s=min(seconds, plan.settings.max_time_s))


def probed_kernels(case: Case, plan: Plan, details: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """Where a library of the cell reports only when a variable is set at start-up (TensorFlow's oneDNN), the
    cell's kernel entries from a probe cell started with it (its times are not kept; a probe that failed says so in
    the entries it leaves); None where none needs one."""
    variables: dict[str, str] = {}
    for entry in kernel_entries(details):
        variables.update(entry.get(VERBOSE_ENVIRONMENT) or {})
    if not variables:
        return None
    settings = briefly_timed(plan, PROBE_MAX_TIME_S)
    outcome = run_worker(case, settings, check_parity=False, env=variables)
    names = ", ".join(f"{name}={value}" for name, value in variables.items())
    if outcome.status != "ok":
        failed = f"; the probe cell started with {names} ended {outcome.status}: {outcome.reason}"
        return [{**entry, "not_reported": f"{entry.get('not_reported')}{failed}"} for entry in kernel_entries(details)]
    entries = kernel_entries(outcome.details)
    return [{**entry, "source": f"{entry.get('source')} (a probe cell started with {names})"} for entry in entries]


def with_probed_kernels(record: ProfileRecord, plan: Plan) -> ProfileRecord:
    """``record`` with its kernel entries from a probe cell where its libraries need one."""
    case = case_of(plan, record)
    if case is None or record.cell is None:
        return record
    probed = probed_kernels(case, plan, record.details)
    return record if probed is None else dataclasses.replace(record, details={**record.details, "kernels": probed})


def sub_plan(plan: Plan, runtimes: Sequence[str]) -> Plan:
    """``plan``'s cells and skipped cells of ``runtimes`` only."""
    return dataclasses.replace(
        plan,
        cases=tuple(case for case in plan.cases if case.runtime in runtimes),
        skipped=tuple(skipped for skipped in plan.skipped if skipped.case.runtime in runtimes),
    )


def command(args: argparse.Namespace, argv: Sequence[str]) -> int:
    a, b = chosen_runtimes(args.runtimes)
    levers = chosen_levers(args.levers, (a, b))
    plan = explain_plan(args, [a, b, *levers])
    compared = [case.runtime for case in plan.cases if case.runtime in (a, b)]
    if len(compared) < 2:
        reasons = "; ".join(f"{s.case.runtime}: {s.reason}" for s in plan.skipped if s.case.runtime in (a, b))
        raise SpecError(f"{args.model} cannot be explained in {a} and {b}: {reasons or 'not planned'}")
    terminate_on_sigterm()
    out = Path(args.out)
    with Store.open(args.db) as store:
        run_id = store.create_run(
            plan, shlex.join(["fwbench", *argv]), environment.collect(), __version__, kind="profile"
        )
        # A and B first: a runtime that cannot be profiled ends the command before the levers run
        profile_cases(store, run_id, sub_plan(plan, (a, b)), out, args.calls, args.db, finish=False)
        records = {record.runtime: record for record in store.profiles([run_id])}
        failed = [records[runtime] for runtime in (a, b) if records[runtime].cell is None]
        if failed:
            store.finish_run(run_id)
            for record in failed:
                print(f"fwbench explain: {record.runtime} could not be profiled: {record.status}: {record.reason}",
                      file=sys.stderr)  # fmt: skip
            return 1
        profile_cases(store, run_id, sub_plan(plan, levers), out, args.calls, args.db)
        records = {record.runtime: record for record in store.profiles([run_id])}
        peak = latest_peak(store)
    first = records[a]
    records[a], records[b] = with_probed_kernels(records[a], plan), with_probed_kernels(records[b], plan)
    flops = matmul_flops(first.model, first.phase, first.batch_size, first.seq_len)
    peak = comparable_peak(peak, first.dtype, first.device, plan.settings.threads)
    explanation = Explanation(group_title(first), records[a], records[b], flops, peak)
    console = make_console()
    console.print(escape(headline(explanation)))
    console.print(explain_table(explanation))
    unknown = [
        f"{record.runtime}: in 'other': {', '.join(record.cell.summary.uncategorized)}"
        for record in (records[a], records[b])
        if record.cell is not None and record.cell.summary.uncategorized
    ]
    lines = [*warning_lines(explanation), rate_legend(flops, peak), *kernel_lines([records[a], records[b]]), *unknown]
    for line in lines:
        console.print(escape(line))
    for base, names in levers_by_base(levers, (a, b)).items():
        measured = [measured_lever(records[name], plan, flops, peak) for name in names if name in records]
        base_cell = records[base].cell
        if measured and base_cell is not None:
            console.print(levers_table(base, base_cell.unprofiled_median_s, measured))
    console.print(escape(f"profile run {run_id} in {args.db}; raw traces under {out}"))
    return 0


def measured_lever(record: ProfileRecord, plan: Plan, flops: ModelFlops | None, peak: Peak | None) -> Lever:
    """A lever from its profile; one that fwbench cannot profile (an engine) timed as a plain inference cell instead,
    parity checked: its median and kernels, no split by op; any other failure as it ended."""
    if record.cell is not None:
        cell = record.cell
        return Lever(
            record.runtime,
            cell.unprofiled_median_s,
            cell.summary.categories_s[RATED_CATEGORY],
            category_rate(cell, flops, peak),
            tuple(kernel_entries(record.details)),
        )
    case = case_of(plan, record)
    if case is None or NO_PROFILER not in (record.reason or ""):
        return Lever(record.runtime, None, note=f"{record.status}: {record.reason}")
    settings = briefly_timed(plan, LEVER_MAX_TIME_S)
    outcome = run_worker(case, settings)
    if outcome.status != "ok" or not outcome.fields.get("median_s"):
        return Lever(record.runtime, None, note=f"{outcome.status}: {outcome.reason}")
    return Lever(
        record.runtime,
        float(outcome.fields["median_s"]),
        kernels=tuple(kernel_entries(outcome.details)),
        note=f"{NO_PROFILER}: timed as a plain cell (adaptive blocks, parity checked)",
        plain=True,
    )

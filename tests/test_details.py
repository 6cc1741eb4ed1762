"""The typed details records (fwbench.details): each writer's record round-trips through its stored form, older rows
read with defaults, malformed values read as None, the writers store the keys they stored before, and the reports
read the records through ResultRecord."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from fwbench.datasets import images
from fwbench.details import (
    CompileReport,
    CorruptFile,
    CpuUnits,
    DataDetails,
    DistributedDetails,
    FirstBatch,
    FitDetails,
    Interleaving,
    PssPeak,
    RankDetail,
    Rendezvous,
    RendezvousNode,
    RoundDetail,
    RoundsStop,
    StageSeconds,
)
from fwbench.report.compare import COMPARE_KEY, environment_record
from fwbench.report.export import CSV_COLUMNS, to_csv
from fwbench.report.flags import bf16_units_flag, cell_flags
from fwbench.report.machines import CELL_FIELDS
from fwbench.report.scaling import scaling_rows
from fwbench.report.table import _loader_cells
from fwbench.spec import CASE_FIELDS, Case, Plan, Settings
from fwbench.speedups import KEY_FIELDS
from fwbench.store import ResultRecord, RunRecord
from fwbench.store.records import COLUMN_NAMES
from fwbench.units import format_bytes
from test_report import row

STAGES = StageSeconds({"start": 0.5, "import": 1.0, "build": 0.25, "compile": 2.0, "first_call": 0.125, "done": 0.1})
DATA = DataDetails(
    dataset="images-48",
    digest="abc123",
    folder="/data/images-48",
    images=12,
    source="files",
    transform="random",
    crop=16,
    pinning="the loader's workers share the cell's 1 pinned core(s) (inherited affinity)",
    corrupt_files=1,
    corrupt=(CorruptFile("img/5.jpg", "cannot identify image file"),),
    first_batch=FirstBatch((4, 3, 16, 16), "float32", 123.5),
    warmup_batches=4,
    timed_batches=8,
    pss_peak_bytes=PssPeak(1000, 500, 1500),
    pss_read="just before and just after the timed batches",
    worker_processes=2,
    cpu_s=0.75,
    cpu_cores_busy=1.5,
    worker_pids=(101, 102),
    workers_left_running=0,
)
DISTRIBUTED = DistributedDetails(
    procs=2,
    scaling="weak",
    global_batch=16,
    rank_batch=8,
    rank=0,
    allreduce_elements=1000,
    allreduce_bytes=4000,
    allreduce_s=(0.002, 0.003, 0.0025),
    allreduce_median_s=0.0025,
)
RENDEZVOUS = Rendezvous(
    address="10.0.0.1",
    ports=(29500, 29501),
    store="tcp",
    nodes=(RendezvousNode(0, "10.0.0.1", (0,)), RendezvousNode(1, "10.0.0.2", (1,))),
)
RANK = RankDetail(0, 0, (0, 1), {"intra_op": 2, "inter_op": 1}, 10, 1.5, STAGES, "ok")
INTERLEAVING = Interleaving(
    subgroups=(1, 2, 1),
    rounds=(RoundDetail(0.5, 4, 2**20, STAGES), RoundDetail(0.25, 4)),
    stop=RoundsStop("budget", 3, 0.07, 0.05),
)
COMPILE = CompileReport(
    export_s=3.0,
    load_s=0.5,
    cached=True,
    artefact="onnx",
    artefact_bytes=4096,
    reexports=(CompileReport(export_s=2.0, load_s=0.25, extra={"input_shapes": [[1, 8]]}),),
    extra={"input_shapes": [[2, 8]], "exporter": "dynamo", "opset": 20},
)
CPU_UNITS = CpuUnits(bf16=("avx512_bf16", "amx_bf16"), int8=())


# -- each record through its stored form ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "record",
    [
        DATA,
        DISTRIBUTED,
        RENDEZVOUS,
        RANK,
        RoundDetail(0.5, 4, 2**20, STAGES),
        COMPILE,
        STAGES,
        FirstBatch((2, 3)),
        RoundsStop("target", 4, 0.049, 0.05),
    ],
    ids=lambda record: type(record).__name__,
)
def test_a_record_reads_back_from_what_its_writer_stores(record: Any) -> None:
    stored = json.loads(json.dumps(record.to_dict(), sort_keys=True))  # as details_json keeps it
    assert type(record).parse(stored) == record


def test_the_records_of_top_level_keys_read_back_from_the_whole_details() -> None:
    details = json.loads(json.dumps({**INTERLEAVING.to_dict(), **CPU_UNITS.to_dict(), "other": 1}))
    assert set(details) == {
        "interleave_subgroups",
        "round_details",
        "rounds_stop",
        "cpu_bf16_units",
        "cpu_int8_units",
        "other",
    }
    assert Interleaving.from_details(details) == INTERLEAVING and INTERLEAVING.most_subgroups == 2
    assert CpuUnits.from_details(details) == CPU_UNITS
    assert Interleaving().to_dict() == {} and CpuUnits().to_dict() == {}  # nothing written for what is not set


def test_the_stored_shapes_are_those_the_writers_built_by_hand() -> None:
    assert DISTRIBUTED.to_dict() == {
        "procs": 2,
        "scaling": "weak",
        "global_batch": 16,
        "rank_batch": 8,
        "rank": 0,
        "allreduce_elements": 1000,
        "allreduce_bytes": 4000,
        "allreduce_s": [0.002, 0.003, 0.0025],
        "allreduce_median_s": 0.0025,
    }
    assert dataclasses.replace(DISTRIBUTED, rank=None).to_dict()["rank"] is None  # a key always written
    assert RENDEZVOUS.to_dict() == {
        "address": "10.0.0.1",
        "ports": [29500, 29501],
        "store": "tcp",
        "nodes": [{"node": 0, "host": "10.0.0.1", "ranks": [0]}, {"node": 1, "host": "10.0.0.2", "ranks": [1]}],
    }
    assert RoundDetail(0.25, 4).to_dict() == {
        "first_call_s": 0.25,
        "calls_per_sample": 4,
        "peak_memory_bytes": None,
        "stage_seconds": None,
        "started_together": False,
    }
    assert COMPILE.to_dict() == {
        "export_s": 3.0,
        "load_s": 0.5,
        "cached": True,
        "artefact": "onnx",
        "artefact_bytes": 4096,
        "reexports": [{"export_s": 2.0, "load_s": 0.25, "input_shapes": [[1, 8]]}],
        "input_shapes": [[2, 8]],
        "exporter": "dynamo",
        "opset": 20,
    }
    # phase data writes its keys stage by stage: only those written so far; cpu_cores_busy null once timed
    facts = DataDetails(dataset="d", digest="x", source="files", corrupt_files=0)
    assert facts.to_dict() == {"dataset": "d", "digest": "x", "source": "files", "corrupt_files": 0}
    timed = dataclasses.replace(facts, timed_batches=8, cpu_cores_busy=None)
    assert timed.to_dict() == {**facts.to_dict(), "timed_batches": 8, "cpu_cores_busy": None}
    assert DATA.to_dict()["pss_peak_bytes"] == {"parent": 1000, "workers": 500, "total": 1500}
    assert DATA.to_dict()["corrupt"] == [{"file": "img/5.jpg", "error": "cannot identify image file"}]
    assert DATA.to_dict()["first_batch"] == {"shape": [4, 3, 16, 16], "dtype": "float32", "sum": 123.5}


# -- older and malformed rows ------------------------------------------------------------------------------------


def test_an_older_row_reads_with_defaults() -> None:
    assert DataDetails.parse({"dataset": "d", "digest": "x"}) == DataDetails(dataset="d", digest="x")
    assert DistributedDetails.parse({"procs": 2}) == DistributedDetails(procs=2)
    assert Rendezvous.parse({"address": "127.0.0.1"}) == Rendezvous(address="127.0.0.1")
    assert RankDetail.parse({"rank": 1}) == RankDetail(rank=1)
    assert RoundDetail.parse({}) == RoundDetail()
    assert RoundsStop.parse({"reason": "target", "rounds": 3}) == RoundsStop("target", 3)
    assert RoundsStop.parse({"reason": "tired", "rounds": 3}) is None and RoundsStop.parse({"reason": "target"}) is None
    assert CompileReport.parse({"export_s": 1.0}) == CompileReport(export_s=1.0)
    assert StageSeconds.parse({"start": 0.5}) == StageSeconds({"start": 0.5})
    assert Interleaving.from_details({}) == Interleaving() and CpuUnits.from_details({}) == CpuUnits()
    old = row(details={"parity": {"ok": True}})  # a row from before any of these was stored
    assert (old.data, old.distributed, old.rendezvous, old.compile_report, old.stage_seconds) == (None,) * 5
    assert old.ranks == () and old.interleaving == Interleaving() and old.cpu_units == CpuUnits()
    assert old.nodes == 1 and not old.exported and old.time_to_first_result_s is None


@pytest.mark.parametrize("raw", [None, [], "text", 3])
def test_a_group_that_is_not_an_object_reads_as_none(raw: object) -> None:
    for record in (DataDetails, DistributedDetails, Rendezvous, RankDetail, RoundDetail, CompileReport, StageSeconds):
        assert record.parse(raw) is None, record
    assert RankDetail.parse_all(raw) == ()


def test_values_of_the_wrong_type_read_as_none() -> None:
    data = DataDetails.parse(
        {
            "digest": 5,
            "images": "12",
            "cpu_cores_busy": "fast",
            "pss_peak_bytes": [1, 2],
            "first_batch": {"shape": "4x3", "sum": "x"},
            "corrupt": {"file": "a"},
            "worker_pids": [1, "two", True, 3],
            "timed_batches": True,  # a bool is no count
        }
    )
    assert data == DataDetails(first_batch=FirstBatch(), worker_pids=(1, 3))
    distributed = DistributedDetails.parse({"procs": "2", "allreduce_s": "slow", "allreduce_median_s": [0.1]})
    assert distributed == DistributedDetails()
    assert Rendezvous.parse({"nodes": [{"node": 0}, "node 1", 7], "ports": "29500"}) == Rendezvous(
        nodes=(RendezvousNode(node=0),)
    )
    assert StageSeconds.parse({"start": "soon", "build": 1}) == StageSeconds({"build": 1.0})
    assert Interleaving.from_details({"interleave_subgroups": "2", "round_details": [3, {"calls_per_sample": 2}]}) == (
        Interleaving(rounds=(RoundDetail(calls_per_sample=2),))
    )
    assert CpuUnits.from_details({"cpu_bf16_units": "amx"}) == CpuUnits()
    assert CompileReport.parse({"cached": 1, "export_s": "3", "reexports": [None, {}]}) == CompileReport(
        cached=True, reexports=(CompileReport(),)
    )
    record = row(details={"data": "x", "distributed": [], "rendezvous": 1, "ranks": {}, "stage_seconds": []})
    assert (record.data, record.distributed, record.rendezvous, record.stage_seconds, record.ranks) == (
        None,
        None,
        None,
        None,
        (),
    )


# -- the writers -------------------------------------------------------------------------------------------------


def test_phase_data_stores_the_dataset_facts_it_stored_before(tmp_path: Path) -> None:
    from fwbench.runner.phases.data import dataset_facts

    folder = tmp_path / "images-48"
    images.make_images(folder, n=6, size=48, seed=3)
    settings = Settings(crop=16)
    record, excluded = dataset_facts(folder, settings, None)  # what phase fit stores under details.fit.input
    facts = record.to_dict()
    assert set(facts) == {
        "dataset", "digest", "folder", "images", "source", "transform", "crop", "pinning", "corrupt_files", "corrupt",
    }  # fmt: skip
    assert facts["images"] == 6 and facts["source"] == "files" and facts["corrupt"] == [] and excluded == []
    packed, excluded = dataset_facts(folder, settings, "packed-torch")  # files: the packed folder is only read
    assert packed.to_dict() == facts and excluded == []
    assert DataDetails.parse(json.loads(json.dumps(record.to_dict()))) == record


def test_the_rank_set_stores_each_ranks_figures_as_before() -> None:
    from fwbench.runner.rankset import combine_results

    results: list[dict[str, Any]] = [
        {"status": "ok", "cpus": [0], "threads_effective": {"intra_op": 1}, "stage_seconds": {"start": 0.5}},
        {"status": "error", "reason": "boom", "peak_memory_bytes": 20, "first_call_s": 1.0},
    ]
    ranks = combine_results(results, [0, 1])["ranks"]
    assert ranks == [
        {
            "rank": 0,
            "node": 0,
            "cpus": [0],
            "threads_effective": {"intra_op": 1},
            "peak_memory_bytes": None,
            "first_call_s": None,
            "stage_seconds": {"start": 0.5},
            "status": "ok",
        },
        {
            "rank": 1,
            "node": 1,
            "cpus": None,
            "threads_effective": None,
            "peak_memory_bytes": 20,
            "first_call_s": 1.0,
            "stage_seconds": None,
            "status": "error",
        },
    ]
    assert RankDetail.parse_all(ranks) == (
        RankDetail(0, 0, (0,), {"intra_op": 1}, stage_seconds=StageSeconds({"start": 0.5}), status="ok"),
        RankDetail(1, 1, None, None, 20, 1.0, None, "error"),
    )


def test_the_rank_set_stores_where_its_ranks_met_as_before() -> None:
    from fwbench.runner.rankset import RankSet

    ranks = object.__new__(RankSet)  # only what rendezvous() reads: nothing started
    ranks.address, ranks.ports, ranks.node_of, ranks.hosts = (
        "10.0.0.1",
        (29500, 29501),
        [0, 1],
        ("10.0.0.1", "10.0.0.2"),
    )
    assert ranks.rendezvous() == RENDEZVOUS.to_dict()
    ranks.address, ranks.node_of, ranks.hosts = "127.0.0.1", [0, 0], ("127.0.0.1", "127.0.0.1")
    assert ranks.rendezvous() == {
        "address": "127.0.0.1",
        "ports": [29500, 29501],
        "store": "file",
        "nodes": [{"node": 0, "host": "127.0.0.1", "ranks": [0, 1]}],
    }


def test_the_scheduler_stores_its_rounds_and_sub_groups_as_before() -> None:
    from fwbench.runner import cell_rounds
    from fwbench.runner.outcome import CellOutcome

    case = Case("mlp", "torch:eager")
    cell = cell_rounds.CellRounds(case)
    for index, first_call in enumerate((0.5, 0.25)):
        fields = {"first_call_s": first_call, "calls_per_sample": 4, "peak_memory_bytes": 100 + index}
        cell.rounds.append(CellOutcome(case, "ok", None, [1e-3], fields, {"stage_seconds": {"start": 0.1}}, []))
    cell.started_together.add(1)  # round 2's workers started side by side: its first call is not a result
    merged = cell_rounds.merge_rounds(cell, "g", "interleaved")
    stages = {"stage_seconds": {"start": 0.1}}
    assert merged.details["round_details"] == [
        {"first_call_s": 0.5, "calls_per_sample": 4, "peak_memory_bytes": 100, **stages, "started_together": False},
        {"first_call_s": None, "calls_per_sample": 4, "peak_memory_bytes": 101, **stages, "started_together": True},
    ]


@pytest.mark.parametrize("counts", [[1, 2, 1], [1, 1, 1]])
def test_the_scheduler_stores_the_sub_groups_of_a_split_group(
    monkeypatch: pytest.MonkeyPatch, counts: list[int]
) -> None:
    from fwbench.runner import scheduler
    from fwbench.runner.outcome import CellOutcome

    def one_round(
        active: Any, cells: Any, settings: Any, checks: Any, weights: Any, index: int, rng: Any, cycle: int
    ) -> tuple[int, int]:
        for case in active:  # every cell ends its round ok, in as many sub-groups as ``counts`` says
            cells[case.key].rounds.append(CellOutcome(case, "ok", None, [1e-3], {"first_call_s": 0.1}, {}, []))
        return cycle, counts[index]

    monkeypatch.setattr(scheduler, "interleaved_round", one_round)
    cases = [Case("mlp", "torch:eager"), Case("mlp", "jax:jit")]
    outcomes = scheduler.run_group(cases, Settings(rounds=3, interleave=True), {})
    for outcome in outcomes:  # stored only when a round was split; then every round's count
        assert outcome.details.get("interleave_subgroups") == (counts if max(counts) > 1 else None)
        assert Interleaving.from_details(outcome.details).most_subgroups == (2 if max(counts) > 1 else None)


# -- the readers -------------------------------------------------------------------------------------------------


def test_the_record_reads_its_details_typed() -> None:
    details = {
        "data": DATA.to_dict(),
        "distributed": DISTRIBUTED.to_dict(),
        "rendezvous": RENDEZVOUS.to_dict(),
        "ranks": [RANK.to_dict()],
        "compile_report": COMPILE.to_dict(),
        "stage_seconds": STAGES.to_dict(),
        **INTERLEAVING.to_dict(),
        **CPU_UNITS.to_dict(),
    }
    record = ResultRecord.from_row(row(details=json.loads(json.dumps(details))).to_dict())
    assert record.data == DATA and record.distributed == DISTRIBUTED and record.rendezvous == RENDEZVOUS
    assert record.ranks == (RANK,) and record.compile_report == COMPILE and record.stage_seconds == STAGES
    assert record.interleaving == INTERLEAVING and record.cpu_units == CPU_UNITS
    assert record.nodes == 2 and record.exported
    # the stages up to the first call's outputs, and the export the cached artefact took
    assert record.time_to_first_result_s == pytest.approx(0.5 + 1.0 + 0.25 + 2.0 + 0.125 + 3.0)


def test_the_reports_read_the_typed_records() -> None:
    data = row(phase="data", workers=2, details={"data": DATA.to_dict()})
    assert _loader_cells(data) == [f"{format_bytes(1500)} ({format_bytes(500)})", "1.50"]
    assert _loader_cells(row()) == ["—", "—"]
    split = row(dtype="bf16", details={**INTERLEAVING.to_dict(), **CPU_UNITS.to_dict()})
    assert "interleaved in 2 sub-groups (memory)" in cell_flags(split)
    assert bf16_units_flag(split) == ["bf16 units: avx512_bf16,amx_bf16"]
    single = row(runtime="torch:ddp", phase="training", procs=1, scaling="weak")
    double = row(
        runtime="torch:ddp", phase="training", procs=2, scaling="weak", details={"distributed": DISTRIBUTED.to_dict()}
    )
    (scaled,) = scaling_rows([single, double])
    assert scaled.allreduce_s == 0.0025
    fit_input = {**dataclasses.replace(DATA, digest="fitdigest").to_dict(), "workers": 1, "wait_fraction": 0.1}
    fit = row(
        phase="fit",
        details={
            "fit": {
                "loop": "manual",
                "steps_per_epoch": 2,
                "final_loss": 0.5,
                "final_accuracy": 0.9,
                "input": fit_input,
            }
        },
    )
    assert fit.fit is not None and fit.fit.input is not None and fit.fit.input.digest == "fitdigest"
    assert fit.fit.extra["input"] == fit_input  # the loop's own report of its loader stays readable
    run = RunRecord(1, "", None, None, "fwbench run", {}, Plan((), Settings()), {}, "0")
    assert environment_record(run, [data, fit])["data.digest"] == "abc123 | fitdigest"
    assert FitDetails.parse({"loop": "x"}) is None  # still: the overhead table's fields or nothing


# -- one declaration of the case key and of the columns ----------------------------------------------------------


def test_the_case_keys_and_columns_come_from_one_declaration() -> None:
    assert CASE_FIELDS == tuple(f.name for f in dataclasses.fields(Case))
    assert COMPARE_KEY == CASE_FIELDS and set(CELL_FIELDS) == set(CASE_FIELDS) and CELL_FIELDS[0] == "model"
    assert KEY_FIELDS == ("run_id", "hardware_id", *(name for name in CASE_FIELDS if name != "runtime"))
    assert set(CASE_FIELDS) <= set(COLUMN_NAMES)
    decoded = {"samples", "details", "noise", "machine", "blocks", "versions"}
    read_with_the_run = {"interval", "priors"}  # fwbench.store.moderation
    typed = {f.name for f in dataclasses.fields(ResultRecord) if f.name not in COLUMN_NAMES} - decoded
    typed -= read_with_the_run
    assert typed == {
        "parity", "precision", "training", "fit", "compile_health", "compile_report", "stage_seconds", "cpu_units",
        "data", "distributed", "ranks", "rendezvous", "interleaving", "serving", "generation",
    }  # fmt: skip


def test_the_csv_header_is_unchanged() -> None:
    header = (
        "run_id,model,runtime,phase,batch_size,seq_len,workers,procs,scaling,dtype,device,status,reason,protocol,"
        "schedule,rounds,rounds_stop,n_samples,calls_per_sample,median_s,ci_low_s,ci_high_s,mean_s,stdev_s,min_s,"
        "first_call_s,"
        "time_to_first_result_s,peak_memory_bytes,allocator_peak_bytes,threads,interop_threads,flops,achieved_gflops,"
        "peak_fraction,samples_per_s,tokens_per_s,wall_s,compile_flags,hostname,hardware_id,software_id,samples"
    )
    assert ",".join(CSV_COLUMNS) == header and to_csv([row()]).splitlines()[0] == header


def test_the_workers_precision_and_compile_records_round_trip() -> None:
    """The worker writes these through the records' to_dict (runner/cell.py); the store parses them back."""
    from fwbench.details import CompileHealth, PrecisionCheck

    looked = PrecisionCheck("bf16", True, {"matmul": ("bfloat16",), "softmax": ("float32",)}, ("matmul: float32",))
    assert PrecisionCheck.parse(json.loads(json.dumps(looked.to_dict()))) == looked
    failed = PrecisionCheck("fp32", error="RuntimeError: no graph")
    assert failed.to_dict() == {"policy": "fp32", "observed": None, "mismatches": [], "error": "RuntimeError: no graph"}
    assert PrecisionCheck.parse(failed.to_dict()) == failed
    health = CompileHealth.measured({"traces": 1, "graph_breaks": 2}, {"traces": 3, "graph_breaks": 2})
    assert health.flags == ("traces +2 in timed loop", "graph breaks 2") and health.recompiled_in_timed_loop
    assert CompileHealth.parse(json.loads(json.dumps(health.to_dict()))) == health

"""Smoke tests of the measurement scripts in benchmarks/: each runs as its docstring says to run it (``python
benchmarks/NAME.py ...`` in a subprocess), on the smallest settings its flags allow, and must exit 0 and print the
figures it is for, so that a script broken by a change elsewhere (a stored field gone, a renamed function) fails
here instead of in front of whoever next wants its numbers. The figures themselves are not checked: they are this
machine's. Scripts that load frameworks for bert-base-sized products or start a Ray cluster run under ``matrix``;
the default run checks that they still start (``--help``)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO_DIR
from fwbench.datasets.images import write_images
from fwbench.spec import Case
from fwbench.store import Store
from report_store import Cell, add_run, timed

BENCHMARKS = REPO_DIR / "benchmarks"
# every script in benchmarks/ and the tests below that run it (a new script without one fails the first test)
SMOKE_TESTS = {
    "bf16_products.py": "test_bf16_products",
    "dtype_speedup.py": "test_dtype_speedup",
    "harness_overhead.py": "test_harness_overhead",
    "jpeg_decoders.py": "test_jpeg_decoders",
    "moderation_scale.py": "test_moderation_scale",
    "ray_cluster.py": "test_ray_cluster_helper_imports",  # a helper of tests/test_ray_executor.py, which runs it
    "ray_sweep.py": "test_ray_sweep",
    "report_scale.py": "test_report_scale",
    "reproducibility.py": "test_reproducibility",
    "settle_pause.py": "test_settle_pause",
    "thread_scaling.py": "test_thread_scaling",
    "zoo_speed.py": "test_zoo_speed_torch",
}
HELP_ONLY_BY_DEFAULT = (
    "bf16_products.py",
    "jpeg_decoders.py",
    "ray_sweep.py",
    "thread_scaling.py",
    "zoo_speed.py",
)  # runs: matrix


def installed(module: str) -> bool:
    """Whether ``module`` can be imported here (without importing it: a framework takes seconds)."""
    return importlib.util.find_spec(module) is not None


def script(name: str, *args: str, tmp_path: Path | None = None, timeout: float = 300) -> str:
    """Run ``python benchmarks/NAME ARGS`` from the repository root (temporary files under ``tmp_path``); its
    stdout. It must exit 0."""
    env = dict(os.environ)
    if tmp_path is not None:
        env["TMPDIR"] = str(tmp_path)
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / name), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        cwd=REPO_DIR,
    )
    assert done.returncode == 0, f"{name} exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return done.stdout


def test_every_script_has_a_smoke_test() -> None:
    assert sorted(p.name for p in BENCHMARKS.glob("*.py")) == sorted(SMOKE_TESTS)
    assert all(name in globals() for name in SMOKE_TESTS.values())


@pytest.mark.parametrize("name", HELP_ONLY_BY_DEFAULT)
def test_script_starts(name: str) -> None:
    """The scripts whose runs are matrix tests still import and parse their flags."""
    assert script(name, "--help").startswith("usage: ")


def test_ray_cluster_helper_imports() -> None:
    """benchmarks/ray_cluster.py is tests/test_ray_executor.py's local cluster (and ray_sweep.py's): it runs there."""
    import ray_cluster

    assert callable(ray_cluster.local_cluster) and callable(ray_cluster.serve)


def test_dtype_speedup(tmp_path: Path) -> None:
    db = tmp_path / "bf16.db"
    cells = [
        Cell(Case("mlp", "torch:eager", batch_size=8, dtype="fp32"), timed(2e-3, 12)),
        Cell(
            Case("mlp", "torch:eager", batch_size=8, dtype="bf16"),
            timed(1e-3, 12, seed=1),
            details={"parity": {"ok": True, "outputs": {"logits": {"rel_l2": 3e-3}}}, "cpu_bf16_units": []},
        ),
        Cell(Case("mlp", "jax:jit", batch_size=8, dtype="fp32"), timed(1e-3, 12, seed=2)),  # no bf16 cell: no row
    ]
    with Store.open(db) as store:
        add_run(store, cells)
    lines = script("dtype_speedup.py", "--db", str(db)).splitlines()
    assert lines[0].startswith("| model | phase | runtime | fp32 | bf16 | fp32/bf16 (95% CI) |")
    assert len(lines) == 3, lines
    assert re.fullmatch(
        r"\| mlp b8 \| inference \| torch:eager \| 2 ms \| 1 ms \| [12]\.\d\d \(.+–.+\) \| 3\.0e-03 \| none \|",
        lines[2],
    )


def test_reproducibility(tmp_path: Path) -> None:
    db = tmp_path / "goal.db"
    with Store.open(db) as store:
        for seed in (0, 100):
            add_run(
                store,
                [
                    Cell(Case("mlp", runtime, batch_size=b), timed(1e-4 * b * factor, 30, seed=seed + b))
                    for runtime, factor in (("torch:eager", 1.0), ("jax:jit", 0.5))
                    for b in (1, 4, 16)
                ],
            )
    out = script("reproducibility.py", "--db", str(db), "--pair", "1", "2", "--first-rounds", "2")
    assert re.search(r"^run 1: \d+\.\d min \(goal ≤ 8\), timed blocks .+ \(.+; goal ≥ 40%\)$", out, re.M), out
    # the same blocks, both ways of making the CIs; then the runs' first 2 rounds alone (no CI from 2 rounds)
    for method in ("moderated", "own"):
        part = out.split(f"runs 1 and 2, their first 2 rounds only, {method} intervals:")[1].split("runs 1 and 2")[0]
        assert re.search(r"jax:jit +geomean speed-up 2\.\d+ → 2\.\d+ \(.+ apart\)", part), out
        assert "cell time no CI (goals ≤ 5%)" in part, out  # 2 rounds: a cell time has no CI
    for method in ("moderated", "own"):
        part = out.split(f"runs 1 and 2, {method} intervals:")[1].split("runs 1 and 2")[0]
        assert re.search(r"jax:jit +geomean speed-up 2\.\d+ → 2\.\d+ \(.+ apart\)", part), out
        assert re.search(r"largest geomean gap: .+% \(goal ≤ 3%\)", part), out
        assert re.search(
            r"consistent with their CIs: \d of 3; consistent and within 10%: \d \(\d+%; goal ≥ 90%\); median CI "
            r"half-width: speed-up ±.+%, cell time ±.+% \(goals ≤ 5%\)",
            part,
        ), out


def test_moderation_scale() -> None:
    out = script("moderation_scale.py", "--groups", "4", "--runtimes", "3")
    assert re.fullmatch(
        r"moderated 12 cells in 4 groups of 3: [\d.]+ s \(time prior over 12 cells, pair prior over 12 pairs\)\n", out
    ), out


def test_settle_pause() -> None:
    out = script("settle_pause.py", "--frameworks", "torch", "--threads", "1", "--blocks", "1").splitlines()
    assert out[0].startswith("| framework | threads |") and len(out) == 3, out
    assert re.fullmatch(r"\| torch \| 1 \| [\d.]+ ms, [\d.]+ ms \| [\d.]+ ms, [\d.]+ ms \|", out[2]), out


def test_report_scale(tmp_path: Path) -> None:
    out = script(
        "report_scale.py", "--results", "40", "--db", str(tmp_path / "scale.db"), "--formats", "table,json,csv,html"
    )
    assert f"generated 40 results in {tmp_path / 'scale.db'}" in out
    for line in ("--format table: ", "--format json: ", "--format csv: ", "--html: "):
        assert re.search(rf"fwbench report {line}\d+\.\d\d s, \d+\.\d\d MiB", out), (line, out)
    assert (tmp_path / "scale.db").exists()


@pytest.mark.slow
@pytest.mark.matrix  # four torch workers and two adaptive runs: ~40 s; the matrix keeps it from rotting
def test_harness_overhead(tmp_path: Path) -> None:
    """Parts 1 to 3, one round of each, on one thread and the shortest budgets (four workers in all)."""
    out = script(
        "harness_overhead.py",
        *("--rounds", "1", "--threads", "1", "--max-time", "0.1", "--repeat", "2", "--adaptive-budget", "0.3"),
        tmp_path=tmp_path,
    )
    assert re.search(r"round 0: fwbench worker .+ µs \(\d+ calls/sample\), bare timeit .+ µs, ratio \d+\.\d{4}", out)
    assert "median ratio worker/bare over 1 rounds: " in out
    assert re.search(r"2\. 10 µs spin: median ratio adaptive/bare timeit \d+\.\d{4}", out), out
    assert re.search(r"3\. hf2019: 90 timed calls \(30 samples × 3\), .+ within-process 95% CI half-width \d", out), out
    assert re.search(r"3\. adaptive: \d+ timed calls .+ within-process 95% CI half-width .+ stop: \w+", out), out


@pytest.mark.slow
@pytest.mark.matrix  # TensorFlow's import is most of its time
@pytest.mark.skipif(not installed("tensorflow"), reason="jpeg_decoders.py compares TensorFlow's decoder with Pillow's")
def test_jpeg_decoders(tmp_path: Path) -> None:
    write_images(tmp_path / "images", n=2, size=16)
    out = script("jpeg_decoders.py", str(tmp_path / "images"), tmp_path=tmp_path)
    for method in ("default", "INTEGER_ACCURATE"):
        assert re.search(
            rf"tf\.io\.decode_jpeg {method}: \d+ of \d+ values differ from Pillow \(\d+%\), by at most", out
        )


@pytest.mark.slow
@pytest.mark.matrix
def test_bf16_products(tmp_path: Path) -> None:
    """Both frameworks' eight compiled products (bert-base's sizes), one timed call each."""
    out = script("bf16_products.py", "--framework", "both", "--calls", "1", "--threads", "1", tmp_path=tmp_path)
    assert out.startswith("CPU bf16 units: ")
    rows = [
        line for line in out.splitlines() if re.fullmatch(r"\| \S+ \| [a-z +]+ \| .+ ms \| .+ ms \| \d+\.\d\d \|", line)
    ]
    assert [row.split(" | ")[0] for row in rows] == ["| jax:jit"] * 4 + ["| tensorflow:xla"] * 4, out


@pytest.mark.slow
@pytest.mark.matrix
@pytest.mark.skipif(
    not installed("transformers"), reason="zoo_speed.py times transformers' models (pip install transformers)"
)
def test_zoo_speed_torch(tmp_path: Path) -> None:
    out = script(
        "zoo_speed.py",
        "--framework",
        "torch",
        "--models",
        "bert-tiny,gpt2-tiny",
        "--shapes",
        "1x8",
        "--calls",
        "1",
        tmp_path=tmp_path,
    )
    for model in ("bert-tiny", "gpt2-tiny"):
        assert re.search(rf"{model} b=1 s=8: ours .+ ms, transformers .+ ms, ratio \d+\.\d{{3}} \(outputs differ", out)


@pytest.mark.slow
@pytest.mark.matrix
@pytest.mark.skipif(
    not (installed("transformers") and installed("tf_keras")),
    reason="zoo_speed.py --framework tensorflow needs transformers and tf-keras (make oracles)",
)
def test_zoo_speed_tensorflow(tmp_path: Path) -> None:
    out = script(
        "zoo_speed.py",
        "--framework",
        "tensorflow",
        "--models",
        "bert-tiny",
        "--shapes",
        "1x8",
        "--calls",
        "1",
        tmp_path=tmp_path,
    )
    assert re.search(r"bert-tiny b=1 s=8: ours .+ ms, transformers .+ ms, ratio \d+\.\d{3}", out), out


@pytest.mark.slow
@pytest.mark.serial  # two threads on two CPUs
@pytest.mark.matrix
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="a 2-thread cell on two CPUs")
def test_thread_scaling() -> None:
    out = script("thread_scaling.py", "--runtimes", "torch:eager", "--rounds", "1", "--batch", "8", "--max-time", "0.1")
    assert re.search(r"^torch:eager round 1: 1 thread [\d.]+ ms, 2 threads [\d.]+ ms, [\d.]+x$", out, re.M), out
    assert re.search(r"^torch:eager: median 1-thread/2-thread ratio [\d.]+x over 1$", out, re.M), out


TINY_SUITE = """\
description = "benchmarks/ray_sweep.py's smoke test: two groups of one cell"
models = ["mlp"]
runtimes = ["torch:eager"]
batch_sizes = [1, 2]

[settings]
max_time_s = 0.2
rounds = 1
"""


@pytest.mark.slow
@pytest.mark.serial
@pytest.mark.matrix
@pytest.mark.skipif(not installed("ray"), reason="ray_sweep.py runs the suite on a local Ray cluster")
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="two Ray nodes pinned to two different CPUs")
def test_ray_sweep(tmp_path: Path) -> None:
    suite = tmp_path / "tiny.toml"
    suite.write_text(TINY_SUITE)
    out = script(
        "ray_sweep.py",
        "--suite",
        str(suite),
        "--threads",
        "1",
        "--db",
        str(tmp_path / "sweep.db"),
        "--shard-max-time",
        "0.1",
    )  # no tmp_path: Ray's files go under /tmp (ray_cluster.py), its socket paths must stay short
    assert f"suite {suite}, --threads 1: 2 cells in 2 groups" in out
    assert re.search(r"ray, 2 nodes \(run 2\): .+ s wall, 2 groups on \d nodes", out), out
    assert "ray overhead per group (task − group on node): median " in out
    assert "ray/local medians, torch:eager" in out and "per-cell ray/local: min " in out
    assert "shards 1/2 + 2/2 merged: 2 cells" in out and "keys equal the plan's: True" in out

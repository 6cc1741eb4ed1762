"""``fwbench run``'s parser: its argument groups (grid, measurement, data, serving, limits, where the cells run,
nodes) and the argument types of its own flags (``--master-port``, ``--shard``). What the flags mean for the plan is
:mod:`fwbench.cli.run_plan`; running it is :mod:`fwbench.cli.run`."""

from __future__ import annotations

import argparse
from pathlib import Path

from fwbench.cli.common import (
    DB_HELP,
    TENSORBOARD_HELP,
    byte_count,
    directory,
    duration,
    non_negative_duration,
    non_negative_float,
    non_negative_int,
    on_off,
    positive_float,
    positive_int,
)
from fwbench.datasets.folders import DEFAULT_IMAGES, DEFAULT_SIZE, cache_folder
from fwbench.measure import environment
from fwbench.runner.ray_executor import START_LINE
from fwbench.spec import (
    COMPILE_MODES,
    DATA_SOURCES,
    DTYPES,
    FIT_SOURCES,
    OPTIMIZER_KINDS,
    PHASES,
    PROTOCOLS,
    TRANSFORMS,
    ShardSpec,
    SpecError,
)
from fwbench.store import DEFAULT_DB
from fwbench.suites import DEFAULT_SUITE, builtin_suites

RUN_DEVICES = ("cpu", "cuda")


def add_flags(run: argparse.ArgumentParser) -> None:
    """Every flag of ``fwbench run`` on its parser ``run``, group by group in the order ``--help`` lists them."""
    _grid_flags(run)
    _measurement_flags(run)
    _data_flags(run)
    _serving_flags(run)
    _generate_flags(run)
    _limit_flags(run)
    _cluster_flags(run)
    _node_flags(run)


def _grid_flags(run: argparse.ArgumentParser) -> None:
    """``fwbench run``'s flags for the grid: suite, models, runtimes, shapes, phase, dtype, device (flags override the suite)."""
    grid = run.add_argument_group("grid (flags override the suite)")
    grid.add_argument(
        "--suite",
        help=f"built-in suite name ({', '.join(builtin_suites())}) or a .toml path; "
        f"default: {DEFAULT_SUITE} unless --models and --runtimes are given",
    )
    grid.add_argument("--models", help="comma-separated model names (see `fwbench list`)")
    grid.add_argument("--runtimes", help="comma-separated framework:mode runtimes (see `fwbench list`)")
    grid.add_argument("--batch-sizes", help="comma-separated positive integers, e.g. 1,2,4,8")
    grid.add_argument(
        "--seq-lens",
        "--prompt-lens",
        help="comma-separated positive integers (default with --models: 128); ignored by models without a sequence "
        "axis; --phase generate: the prompts' lengths",
    )
    grid.add_argument(
        "--workers",
        help="--phase data: comma-separated loader worker counts, e.g. 0,1,2 (0: the loader's own process; "
        "tf.data: parallel map calls, 0 = AUTOTUNE); default 0",
    )
    grid.add_argument(
        "--procs",
        help="data-parallel runtimes (torch:ddp, ...; --phase training, or fit for torch:ddp): comma-separated process "
        "counts, e.g. 1,2; "
        "a cell runs as N cooperating processes on disjoint cores, rendezvous on 127.0.0.1 (docs/distributed.md)",
    )
    grid.add_argument(
        "--scaling",
        help="with --procs: weak (default: --batch-sizes is each process's batch, the global batch N × it), strong "
        "(--batch-sizes is the global batch, split evenly), or weak,strong",
    )
    grid.add_argument(
        "--phase",
        choices=PHASES,
        help="inference (default), training (one optimizer step per "
        "timed call; bf16: mixed precision, float32 master weights), fit (fp32; --epochs over a seeded "
        "in-memory dataset with each runtime's training loop: model.fit, Trainer.fit or a manual loop; "
        "one sample per epoch), data (an input pipeline's batches of a JPEG dataset: torch:dataloader, "
        "tensorflow:data, grain:dataloader; one call per batch) or serving (the runtime behind an HTTP server under "
        "MLPerf LoadGen's load; --batch-sizes is the max batch; docs/serving.md) or generate (greedy decoding with "
        "a key/value cache of GPT-2 and the Llama layout: one prefill, then one decode call per token, the tokens "
        "checked; docs/generation.md); overrides the suite's and every [[grid]]'s own phase",
    )
    grid.add_argument(
        "--dtype",
        choices=DTYPES,
        help="default: fp32; bf16: the one mixed-precision policy; int8 (inference): ONNX Runtime's dynamic "
        "quantisation and LiteRT's dynamic-range quantisation of the exported model (other runtimes: skipped); "
        "overrides the suite's and every [[grid]]'s own dtype",
    )
    grid.add_argument(
        "--device", choices=RUN_DEVICES, help="default: cpu; overrides the suite's and every [[grid]]'s own device"
    )


def _measurement_flags(run: argparse.ArgumentParser) -> None:
    """``fwbench run``'s flags for how each cell is measured: protocol, rounds, threads, timing budgets, training and fit settings."""
    timing = run.add_argument_group("measurement")
    timing.add_argument(
        "--protocol",
        choices=PROTOCOLS,
        help="adaptive (default): blocks of ≥50 ms; interleaved, --max-time is shared by the rounds (at least 5 "
        "blocks a round); --interleave off: blocks until the median's 95%% CI is within ±1%% or --max-time is spent; "
        "hf2019: 30 blocks of 3 calls (timeit repeat=30 number=3, as the 2019 study), spread over the rounds",
    )
    timing.add_argument(
        "--max-time",
        type=positive_float,
        metavar="SECONDS",
        help="adaptive: timing budget per cell over its --rounds (an extra round adds one round's share; default 5)",
    )
    timing.add_argument(
        "--rounds",
        type=positive_int,
        help="fresh sets of workers per comparison group (default 3): a cell's CI and every significance verdict "
        "include the variation between rounds, and are given only with 3 or more",
    )
    timing.add_argument(
        "--budget",
        type=duration,
        metavar="DURATION",
        help="wall time of the sweep (seconds, or 90s, 7.5m, 1h): once every comparison group has its --rounds, "
        "extra rounds go, one at a time, to the group whose widest speed-up CI is widest against --target-ci per "
        "second of its round, while the next one fits (default: none, --rounds only; the quick suite: 7.5m)",
    )
    timing.add_argument(
        "--target-ci",
        type=positive_float,
        metavar="FRACTION",
        help="with --budget: a group needs no more rounds once the 95%% CI of each speed-up over its baseline (of the "
        "cell time, for one runtime) is within ± this fraction (default 0.05)",
    )
    timing.add_argument(
        "--max-rounds",
        type=positive_int,
        help="with --budget: the most rounds a comparison group runs, --rounds included (default 10; equal to "
        "--rounds: no extra rounds)",
    )
    timing.add_argument(
        "--spread",
        type=non_negative_duration,
        metavar="DURATION",
        help="the --rounds of consecutive comparison groups estimated to take this long together run in turn: round "
        "1 of each, then round 2 in the reverse order, and so on, so a machine that drifts over minutes shifts every "
        "group's rounds alike instead of one group's cells; a run killed meanwhile keeps their rounds so far, and "
        "--resume runs those groups again (default 10m; 0: each group's rounds back to back)",
    )
    timing.add_argument(
        "--interleave",
        type=on_off,
        metavar="{on,off}",
        help="on (default): the runtimes of a comparison group (same model, phase, shape, dtype, device) are alive "
        "together and take turns at timed blocks in a seeded random order, so speed-ups come from paired blocks "
        "that saw the same machine state (phase fit: one epoch per turn); off: one cell after another, each timed "
        "in one go",
    )
    timing.add_argument(
        "--settle",
        type=non_negative_float,
        metavar="SECONDS",
        help="interleaved: the longest idle pause before a block when another worker timed the last one; it ends "
        "once that worker's threads (spinning thread pools) have not run for 2 ms (default 0.05)",
    )
    timing.add_argument(
        "--threads",
        type=positive_int,
        help=f"intra-op threads for every framework (default: physical cores, here "
        f"{environment.physical_core_count()}; --phase serving: one fewer, at least 1, the load generator's core)",
    )
    timing.add_argument("--interop-threads", type=positive_int, help="inter-op threads (default 1)")
    timing.add_argument(
        "--rank-threads",
        type=positive_int,
        help="--procs: threads of each process (a cell of N processes uses N × this many cores); default: --threads "
        "is the cell's total, split evenly over its processes",
    )
    timing.add_argument(
        "--warmup", type=positive_int, metavar="CALLS", help="untimed calls after the first call (default 2, minimum 2)"
    )
    timing.add_argument("--seed", type=int, help="seed of weights and inputs (default 0)")
    timing.add_argument(
        "--weights",
        metavar="FILE|DIR",
        help="safetensors weights (Hugging Face / torchvision names) "
        "for the one model of the run, instead of the seeded canonical weights; or a local Hugging Face checkpoint "
        "directory (config.json and model.safetensors) of a GPT-2 or Llama-layout decoder, run as the model named "
        "after the directory (--models may then be left out)",
    )
    timing.add_argument(
        "--compile-mode",
        choices=COMPILE_MODES,
        help="torch:compile only (other runtimes ignore it): passed as torch.compile(mode=...); "
        "default: default (inductor's balance of compile time and speed); reduce-overhead adds "
        "CUDA graphs (GPU only; no effect on a CPU); max-autotune also benchmarks matmul/conv "
        "kernel choices while compiling (a much longer first call)",
    )
    timing.add_argument(
        "--optimizer",
        choices=OPTIMIZER_KINDS,
        help="--phase training and fit: the optimizer of every framework (default adamw: "
        "lr 1e-3, betas 0.9/0.999, eps 1e-10, weight decay 0.01; sgd: lr 1e-2, momentum 0.9)",
    )
    timing.add_argument(
        "--epochs",
        type=positive_int,
        help="--phase fit only: epochs (default 5, at least 2; epoch 1 includes compilation and is "
        "stored as the first call, epochs 2.. are the samples)",
    )
    timing.add_argument(
        "--fit-samples",
        type=positive_int,
        metavar="N",
        help="--phase fit only: samples of the seeded synthetic dataset (default 4096; a multiple of every batch size)",
    )
    timing.add_argument(
        "--fit-logging",
        type=directory,
        metavar="DIR",
        help="--phase fit, torch:lightning only (other runtimes ignore it): turn on Lightning's "
        "CSVLogger (DIR/<model>-b<batch>/version_<n>/metrics.csv: train_loss per epoch, and per "
        "step every 50 steps, Lightning's default) and "
        "ModelCheckpoint (the last epoch's .ckpt in that version's checkpoints/); default: both off, "
        "nothing written",
    )


def _data_flags(run: argparse.ArgumentParser) -> None:
    """``fwbench run``'s flags for phase data and phase fit from images."""
    data = run.add_argument_group(
        "--phase data (input pipelines) and --phase fit from images (--input, --fit-source); other phases ignore these"
    )
    data.add_argument(
        "--input",
        metavar="DIR",
        help="a dataset folder written by `fwbench data make images` (its name is the cells' model); default: "
        f"{DEFAULT_IMAGES} images of {DEFAULT_SIZE} px, written once into {cache_folder()}",
    )
    data.add_argument("--crop", type=positive_int, metavar="PX", help="side of the images handed out (default 224)")
    data.add_argument(
        "--transform",
        choices=TRANSFORMS,
        help="random (default): random-resized crop (scale 0.08-1, ratio 3/4-4/3) and horizontal flip, seeded per "
        "image and epoch; center-crop: the central square (deterministic; the loaders agree on it)",
    )
    data.add_argument(
        "--data-batches",
        type=positive_int,
        metavar="N",
        help="batches timed per round, in min(8, N) blocks of N // blocks, after the first batch and the warm-up "
        "(default 64)",
    )
    data.add_argument(
        "--data-source",
        choices=DATA_SOURCES,
        help="files (default): every loader reads the JPEG files; packed: tf.data reads the TFRecord shards and "
        "Grain the ArrayRecord files (DataLoader reads the files either way)",
    )
    data.add_argument(
        "--fit-source",
        choices=FIT_SOURCES,
        help="--phase fit: memory (the seeded in-memory dataset; the default without --input) or input (the images "
        "of --input or the default dataset through each framework's own loader, cropped to the model's image size: "
        "torch:eager and torch:lightning ← DataLoader, tensorflow:function and keras:tensorflow ← tf.data, jax:jit "
        "and keras:jax ← Grain; the default with --input), with the fraction of each epoch its loop waited for data",
    )
    data.add_argument(
        "--fit-workers",
        type=non_negative_int,
        metavar="N",
        help="--phase fit from input: the loader's workers (tf.data: parallel calls; default 1)",
    )
    data.add_argument(
        "--skip-corrupt",
        action="store_const",
        const=True,
        help="leave out images that do not decode (stored as details.data.corrupt_files) instead of failing the "
        "cell with the first one's name",
    )


def _limit_flags(run: argparse.ArgumentParser) -> None:
    """``fwbench run``'s flags for per-cell limits, the settings file, the database and --resume."""
    limits = run.add_argument_group("limits (a cell over a limit is stored as timeout or oom)")
    limits.add_argument("--timeout", type=positive_float, metavar="SECONDS", help="per cell (default 600)")
    limits.add_argument(
        "--memory-limit",
        type=byte_count,
        metavar="BYTES",
        help="kill a worker whose resident memory exceeds this (e.g. 2G, 512M)",
    )
    run.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="TOML file with a [settings] table (keys: the "
        "fields of the stored settings, e.g. threads, protocol, max_time_s, timeout_s, "
        "memory_limit_bytes); overrides the suite's [settings], flags override it",
    )
    run.add_argument("--db", default=DEFAULT_DB, help=DB_HELP)
    run.add_argument(
        "--resume",
        type=positive_int,
        metavar="RUN_ID",
        help="run only the cells of that run's stored plan that are not finished: no status yet, or fewer than its --rounds "
        "(a --spread window it was stopped in: those groups run again from their first round)",
    )


def _cluster_flags(run: argparse.ArgumentParser) -> None:
    """``fwbench run``'s flags for where the cells run: --executor, --ray-address, --shard."""
    cluster = run.add_argument_group("where the cells run")
    cluster.add_argument(
        "--executor",
        choices=("local", "ray"),
        default="local",
        help="local (default): on this machine, group after group; ray: each comparison group is a Ray task on a "
        "node of its own (a node runs one group at a time, with the same scheduler, workers, pinning and limits as "
        "locally), stored here as it arrives; needs `pip install 'fwbench[ray]'`",
    )
    cluster.add_argument(
        "--ray-address",
        metavar="HOST:PORT",
        help="--executor ray: the head node's address (nodes started with "
        f"`{START_LINE}`); default: a local one-node Ray instance on 127.0.0.1",
    )
    cluster.add_argument(
        "--shard",
        type=shard_spec,
        metavar="I/N",
        help="run shard I of N of the plan: its comparison groups ordered by the SHA-256 of their key and dealt "
        "round-robin (disjoint shards that together cover the plan; a group is never split); the run stores the "
        "whole plan's hash and I/N, and `fwbench merge` reunites the shards' databases into one run",
    )


def _serving_flags(run: argparse.ArgumentParser) -> None:
    """``fwbench run``'s flags for phase serving."""
    serving = run.add_argument_group(
        "--phase serving (the runtime behind fwbench's HTTP server, under MLPerf LoadGen's load; --batch-sizes is the "
        "dynamic batcher's max batch size); other phases ignore these"
    )
    serving.add_argument(
        "--max-delay",
        type=non_negative_duration,
        metavar="DURATION",
        help="the longest a request waits for others to batch with (default 1ms; 0: a batch is what is queued)",
    )
    serving.add_argument(
        "--p99-bound",
        type=duration,
        metavar="DURATION",
        help="the peak load search's bound on the p99 latency, counted from each request's scheduled send "
        "(default 20ms)",
    )
    serving.add_argument(
        "--point-duration",
        type=duration,
        metavar="DURATION",
        help="scheduled time of each load point (default 1.5s); a round runs 8 points",
    )
    serving.add_argument(
        "--port", type=int, metavar="PORT", help="the server's port on 127.0.0.1 (default 0: any free port)"
    )


def _generate_flags(run: argparse.ArgumentParser) -> None:
    """``fwbench run``'s flags for phase generate (--prompt-lens is --seq-lens by its other name)."""
    generate = run.add_argument_group(
        "--phase generate (greedy decoding with a key/value cache: one prefill over the prompt, then one decode call "
        "per new token; --prompt-lens or --seq-lens is the prompt's length); other phases ignore these"
    )
    generate.add_argument(
        "--new-tokens",
        type=positive_int,
        metavar="N",
        help="tokens each generation adds to its prompt, the prefill's included (default 32)",
    )


def _node_flags(run: argparse.ArgumentParser) -> None:
    """``fwbench run``'s flags for one distributed cell across machines (--nnodes ...) and --tensorboard."""
    spread = run.add_argument_group(
        "one distributed cell across machines (start the same command on every machine, each with its --node-rank)"
    )
    spread.add_argument(
        "--nnodes",
        type=positive_int,
        metavar="M",
        help="machines a cell of several processes (--procs N) spans, N / M processes on each (N must be a "
        "multiple of M; a cell of 1 process runs on node 0); default 1",
    )
    spread.add_argument(
        "--node-rank",
        type=non_negative_int,
        default=0,
        metavar="R",
        help="this machine's place: 0 (default) plans, times and stores; 1..M-1 only serve node 0's ranks and store "
        "nothing",
    )
    spread.add_argument(
        "--master-addr",
        metavar="HOST",
        help="--nnodes: node 0's address the other nodes reach; node 0 listens there for them (and the frameworks' "
        "rendezvous, torch's store and JAX's coordinator, are there)",
    )
    spread.add_argument(
        "--master-port", type=port_number, metavar="P", help="--nnodes: the port node 0 listens at for the other nodes"
    )
    spread.add_argument(
        "--join-timeout",
        type=positive_float,
        default=300.0,
        metavar="SECONDS",
        help="--nnodes: how long node 0 waits for the other nodes, and they for node 0 (default 300)",
    )
    run.add_argument(
        "--tensorboard",
        type=Path,
        metavar="DIR",
        help=TENSORBOARD_HELP + "; each cell is written as soon as it is stored",
    )


def port_number(text: str) -> int:
    """A TCP port 1..65535 (argparse type)."""
    try:
        port = int(text)
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"expected a TCP port 1..65535, got {text!r}")
    return port


def shard_spec(text: str) -> ShardSpec:
    """``--shard I/N`` (argparse type): ArgumentTypeError, so the message is argparse's one line."""
    try:
        return ShardSpec.parse(text)
    except SpecError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--shard ")) from None

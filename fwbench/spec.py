"""What a benchmark case is: the frozen key every other layer merges on.

A :class:`Case` names one cell of a sweep (model, runtime, phase, shape, dtype, device).
A :class:`Settings` holds what is shared by every cell of a run (threads, protocol, limits).
A :class:`Plan` is the ordered list of cases of one run, plus its settings.
Nothing here imports a framework.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

Phase = Literal["inference", "training", "fit", "data", "serving", "generate"]
Dtype = Literal["fp32", "bf16", "int8"]
Device = Literal["cpu", "cuda"]
Protocol = Literal["adaptive", "hf2019"]
CompileMode = Literal["default", "reduce-overhead", "max-autotune"]  # torch.compile(mode=...)
OptimizerKind = Literal["sgd", "adamw"]  # phase training; hyperparameters in fwbench.models.training.OPTIMIZERS
Status = Literal["ok", "oom", "timeout", "error", "skipped", "mismatch"]
Transform = Literal["random", "center-crop"]  # phase data: fwbench.datasets.transforms
DataSource = Literal["files", "packed"]  # phase data: the JPEG files, or the loader's packed format
FitSource = Literal["memory", "input"]  # phase fit: the seeded in-memory dataset, or the data phase's images
# A distributed cell (``Case.procs``): weak scaling, the batch size is each process's (the global batch is procs ×
# it); strong scaling, the batch size is the global batch, split evenly over the processes.
Scaling = Literal["weak", "strong"]

# Every phase's facts (its dtypes, whether its cells run as several processes or have a model, its FLOPs) are the
# phase's own: fwbench.runner.phases. bf16 is one mixed-precision policy in every framework (fwbench.precision;
# docs/precision.md); int8 the deployment engines that quantise.
PHASES: tuple[str, ...] = get_args(Phase)
# Largest batch size, sequence length or count accepted (fits every store column and framework index).
MAX_COUNT = 2**31 - 1
DTYPES: tuple[str, ...] = get_args(Dtype)
DEVICES: tuple[str, ...] = get_args(Device)
PROTOCOLS: tuple[str, ...] = get_args(Protocol)
COMPILE_MODES: tuple[str, ...] = get_args(CompileMode)
OPTIMIZER_KINDS: tuple[str, ...] = get_args(OptimizerKind)
STATUSES: tuple[str, ...] = get_args(Status)
TRANSFORMS: tuple[str, ...] = get_args(Transform)
DATA_SOURCES: tuple[str, ...] = get_args(DataSource)
FIT_SOURCES: tuple[str, ...] = get_args(FitSource)
SCALINGS: tuple[str, ...] = get_args(Scaling)


class SpecError(ValueError):
    """A user-facing validation error: its message is one line saying what is wrong and what is allowed."""


def _check_choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise SpecError(f"unknown {name} {value!r}; allowed: {', '.join(allowed)}")


def _check_positive_int(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= MAX_COUNT:
        raise SpecError(f"{name} must be a positive integer up to {MAX_COUNT}, got {value!r}")


def _is_number_in(value: object, low: float, high: float, *, low_open: bool = False, high_open: bool = False) -> bool:
    """Whether ``value`` is an int or float (not a bool) from ``low`` to ``high`` (each bound excluded when open)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    above = low < value if low_open else low <= value
    below = value < high if high_open else value <= high
    return above and below


@dataclass(frozen=True, order=True)
class Case:
    """One cell of a sweep. ``seq_len`` is None for models without a sequence axis. Phase data: ``model`` is the
    dataset's name (e.g. ``images-256``), ``runtime`` the loader and ``workers`` its worker count (None in every
    other phase). A distributed cell (a data-parallel runtime, ``--procs``) runs as ``procs`` cooperating processes
    and says how ``batch_size`` is read (``scaling``: see :data:`Scaling`); both are None for every other cell.
    Which phases take a process count or a worker count is the phase's (``fwbench.runner.phases.check_case``, which
    the planner applies to every cell)."""

    model: str
    runtime: str
    phase: Phase = "inference"
    batch_size: int = 1
    seq_len: int | None = None
    dtype: Dtype = "fp32"
    device: Device = "cpu"
    workers: int | None = None
    procs: int | None = None
    scaling: Scaling | None = None

    def __post_init__(self) -> None:
        _check_choice("phase", self.phase, PHASES)
        if (self.procs is None) != (self.scaling is None):
            raise SpecError("a distributed cell has both a process count and a scaling; other cells have neither")
        if self.procs is not None:
            _check_positive_int("process count", self.procs)
            _check_choice("scaling", self.scaling, SCALINGS)  # type: ignore[arg-type]
            if self.scaling == "strong" and self.batch_size % self.procs:
                raise SpecError(
                    f"strong scaling splits the global batch {self.batch_size} evenly: {self.procs} processes "
                    "do not divide it"
                )
        if self.workers is not None and (
            not isinstance(self.workers, int) or isinstance(self.workers, bool) or not 0 <= self.workers <= MAX_COUNT
        ):
            raise SpecError(f"workers must be an integer from 0 to {MAX_COUNT}, got {self.workers!r}")
        _check_choice("dtype", self.dtype, DTYPES)
        _check_choice("device", self.device, DEVICES)
        _check_positive_int("batch size", self.batch_size)
        if self.seq_len is not None:
            _check_positive_int("sequence length", self.seq_len)

    @property
    def key(self) -> str:
        """A stable text key, unique within a run (used as the store's uniqueness key)."""
        seq = "-" if self.seq_len is None else str(self.seq_len)
        parts = [self.model, self.runtime, self.phase, str(self.batch_size), seq, self.dtype, self.device]
        if self.workers is not None:
            parts.append(f"w{self.workers}")
        if self.procs is not None:
            parts.append(f"p{self.procs}{self.scaling}")
        return "|".join(parts)

    @property
    def global_batch(self) -> int:
        """Samples one timed call processes over all the cell's processes."""
        return self.batch_size * self.procs if self.procs is not None and self.scaling == "weak" else self.batch_size

    @property
    def rank_batch(self) -> int:
        """Samples each process takes per call: rows ``[r·rank_batch, (r+1)·rank_batch)`` of the global batch."""
        return self.global_batch // (self.procs or 1)

    @property
    def framework(self) -> str:
        return self.runtime.split(":", 1)[0]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Case:
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data})

    def label(self) -> str:
        return f"{self.model} {self.runtime} {self.phase} {self.shape} {self.dtype}"

    @property
    def shape(self) -> str:
        """``b=8 s=128``, ``b=32 w=2``, ``b=8 s=128 p=2 weak``: the batch size, then the sequence length or worker
        count where set, then a distributed cell's process count and scaling."""
        return shape_text(self.batch_size, self.seq_len, self.workers, self.procs, self.scaling)


# The fields that name a cell, in Case's order: a stored row has each as a column, and every key that matches rows
# (fwbench.speedups.KEY_FIELDS, compare's, the by-machine view's) is made of them.
CASE_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Case))


def shape_text(
    batch_size: int,
    seq_len: int | None,
    workers: int | None = None,
    procs: int | None = None,
    scaling: str | None = None,
) -> str:
    """A cell's shape in words: ``b=8``, ``b=8 s=128``, (phase data) ``b=32 w=2`` or (distributed)
    ``b=8 s=128 p=2 weak`` (``b`` as ``--batch-sizes`` gave it: per process in weak scaling, global in strong)."""
    return (
        f"b={batch_size}"
        + ("" if seq_len is None else f" s={seq_len}")
        + ("" if workers is None else f" w={workers}")
        + ("" if procs is None else f" p={procs} {scaling}")
    )


@dataclass(frozen=True)
class Settings:
    """Settings shared by every cell of a run; stored with the run and with each result."""

    threads: int = field(default=1, metadata={"help": "intra-op threads for every framework"})
    interop_threads: int = field(default=1, metadata={"help": "inter-op threads for every framework"})
    rank_threads: int | None = field(
        default=None,
        metadata={
            "help": "distributed cells (--procs): threads of each process, so a cell of N processes uses N × this "
            "many cores (None: --threads is the cell's total, split evenly over its processes)"
        },
    )
    nodes: int = field(
        default=1,
        metadata={
            "help": "distributed cells (--procs) of more than one process span this many machines (--nnodes), "
            "procs / nodes processes on each; a cell of one process runs on node 0"
        },
    )
    protocol: Protocol = field(default="adaptive", metadata={"help": "timing protocol"})
    max_time_s: float = field(default=5.0, metadata={"help": "adaptive: time budget per cell, seconds"})
    target_rel_ci: float = field(default=0.01, metadata={"help": "adaptive: stop at CI half-width / median"})
    min_block_s: float = field(default=0.05, metadata={"help": "adaptive: shortest timed block, seconds"})
    rounds: int = field(
        default=1,
        metadata={
            "help": "fresh sets of workers per comparison group; a CI and a significance verdict need at least 3 "
            "(fwbench run and the suites default to 3; 1 here for library callers)"
        },
    )
    max_rounds: int = field(
        default=10,
        metadata={
            "help": "with a budget: the most rounds a comparison group runs, its minimum rounds included (at least "
            "rounds)"
        },
    )
    target_ci: float = field(
        default=0.05,
        metadata={
            "help": "with a budget: extra rounds go to the comparison groups whose widest speed-up CI half-width "
            "over their baseline is above this fraction (0.05 = ±5%)"
        },
    )
    budget_s: float | None = field(
        default=None,
        metadata={
            "help": "wall seconds of the sweep within which comparison groups get extra rounds once every group "
            "has its minimum rounds (None: the minimum rounds only)"
        },
    )
    spread_s: float = field(
        default=600.0,
        metadata={
            "help": "the minimum rounds of consecutive comparison groups estimated to take this many seconds together "
            "run in turn (round 1 of each, round 2 in the reverse order, ...), so a drift of the machine over "
            "minutes falls on every group's rounds alike instead of on one group (0: each group's rounds back to "
            "back)"
        },
    )
    interleave: bool = field(
        default=True,
        metadata={
            "help": "the runtimes of a comparison group are alive together and take turns at timed blocks in a "
            "seeded random order (False: one cell after another, each timed in one go)"
        },
    )
    settle_s: float = field(
        default=0.05,
        metadata={
            "help": "interleaved: the longest idle pause before a worker's block when another worker timed the last "
            "one; the pause ends once that worker's threads have not run for 2 ms"
        },
    )
    warmup_calls: int = field(default=2, metadata={"help": "untimed calls after the first call"})
    timeout_s: float = field(default=600.0, metadata={"help": "wall-clock limit per cell, seconds"})
    memory_limit_bytes: int | None = field(default=None, metadata={"help": "kill a worker above this RSS"})
    seed: int = field(default=0, metadata={"help": "seed for weights and inputs"})
    weights_path: str | None = field(default=None, metadata={"help": "safetensors weights instead of seeded ones"})
    compile_mode: CompileMode = field(
        default="default", metadata={"help": "torch:compile only: torch.compile(mode=...)"}
    )
    optimizer: OptimizerKind = field(
        default="adamw", metadata={"help": "phases training and fit: the optimizer of every framework"}
    )
    epochs: int = field(
        default=5,
        metadata={
            "help": "phase fit: epochs over the synthetic dataset (at least 2; "
            "epoch 1 includes compilation and is stored as the first call)"
        },
    )
    fit_samples: int = field(
        default=4096,
        metadata={"help": "phase fit: samples in the seeded synthetic dataset (a multiple of every batch size)"},
    )
    fit_logging: str | None = field(
        default=None,
        metadata={
            "help": "phase fit, torch:lightning only: directory "
            "for Lightning's CSVLogger and ModelCheckpoint (both "
            "off when unset)"
        },
    )

    data_input: str | None = field(
        default=None,
        metadata={"help": "phase data: the dataset folder (fwbench data make images); None: the default dataset"},
    )
    crop: int = field(default=224, metadata={"help": "phase data: side of the square images a loader hands out, px"})
    transform: Transform = field(
        default="random",
        metadata={"help": "phase data: random (random-resized crop + flip) or center-crop (deterministic)"},
    )
    data_batches: int = field(
        default=64, metadata={"help": "phase data: batches timed per round, after the first batch and warm-up"}
    )
    data_source: DataSource = field(
        default="files",
        metadata={
            "help": "phase data: the JPEG files (every loader), or the loader's packed format (TFRecord, "
            "ArrayRecord; DataLoader reads the files either way)"
        },
    )
    fit_source: FitSource = field(
        default="memory",
        metadata={
            "help": "phase fit: memory (the seeded in-memory dataset) or input (the data phase's images through "
            "the framework's own loader, --input or the default dataset; given --input, the default)"
        },
    )
    fit_workers: int = field(
        default=1, metadata={"help": "phase fit from input: the loader's workers (0: the training process decodes)"}
    )
    skip_corrupt: bool = field(
        default=False,
        metadata={"help": "phase data: leave out images that do not decode (counted) instead of failing the cell"},
    )

    serve_max_delay_s: float = field(
        default=0.001,
        metadata={
            "help": "phase serving: the longest a request waits for others to batch with (the dynamic batcher's max "
            "queue delay; the max batch size is the cell's batch size), seconds"
        },
    )
    serve_p99_bound_s: float = field(
        default=0.02, metadata={"help": "phase serving: the p99 latency bound of the peak load search, seconds"}
    )
    serve_point_s: float = field(
        default=1.5, metadata={"help": "phase serving: scheduled seconds of each load point (LoadGen's duration)"}
    )
    serve_port: int = field(
        default=0, metadata={"help": "phase serving: the server's port on 127.0.0.1 (0: any free port)"}
    )
    new_tokens: int = field(
        default=32,
        metadata={
            "help": "phase generate: tokens each generation adds to its prompt (one prefill, then a decode each)"
        },
    )

    def __post_init__(self) -> None:
        # The checks by theme, in this order (the first invalid setting names the error).
        self._check_workers()
        self._check_rounds()
        self._check_data()
        self._check_serving()
        _check_positive_int("new tokens", self.new_tokens)
        self._check_fit()
        self._check_timing()
        self._check_limits()

    def _check_workers(self) -> None:
        """Threads, nodes and how a worker is talked to and compiles and trains."""
        _check_positive_int("threads", self.threads)
        _check_positive_int("interop threads", self.interop_threads)
        _check_positive_int("node count", self.nodes)
        if self.rank_threads is not None:
            _check_positive_int("threads per process", self.rank_threads)
        _check_choice("protocol", self.protocol, PROTOCOLS)
        _check_choice("compile mode", self.compile_mode, COMPILE_MODES)
        _check_choice("optimizer", self.optimizer, OPTIMIZER_KINDS)

    def _check_rounds(self) -> None:
        """Warm-up calls, rounds, the budget of extra rounds and how the rounds are spread and interleaved."""
        _check_positive_int("warm-up calls", self.warmup_calls)
        _check_positive_int("rounds", self.rounds)
        _check_positive_int("max rounds", self.max_rounds)
        for name, value in (("target CI", self.target_ci), ("budget", self.budget_s)):
            if value is not None and not _is_number_in(value, 0, math.inf, low_open=True, high_open=True):
                raise SpecError(f"{name} must be a positive finite number, got {value!r}")
        if not _is_number_in(self.spread_s, 0, math.inf, high_open=True):
            raise SpecError(f"spread must be a finite number of seconds of at least 0, got {self.spread_s!r}")
        if not isinstance(self.interleave, bool):
            raise SpecError(f"interleave must be true or false, got {self.interleave!r}")
        if not _is_number_in(self.settle_s, 0, 10, high_open=True):
            raise SpecError(f"settle time must be a number of seconds from 0 to 10, got {self.settle_s!r}")

    def _check_data(self) -> None:
        """Phase data's images and loaders, and what phase fit reads (epochs, source, workers, samples)."""
        _check_positive_int("epochs", self.epochs)
        _check_positive_int("crop", self.crop)
        _check_positive_int("data batches", self.data_batches)
        _check_choice("transform", self.transform, TRANSFORMS)
        _check_choice("data source", self.data_source, DATA_SOURCES)
        _check_choice("fit source", self.fit_source, FIT_SOURCES)
        if not isinstance(self.fit_workers, int) or isinstance(self.fit_workers, bool) or self.fit_workers < 0:
            raise SpecError(f"fit workers must be an integer of at least 0, got {self.fit_workers!r}")
        if not isinstance(self.skip_corrupt, bool):
            raise SpecError(f"skip corrupt must be true or false, got {self.skip_corrupt!r}")
        if self.data_input is not None and (not isinstance(self.data_input, str) or not self.data_input):
            raise SpecError(f"data input must be a folder path, got {self.data_input!r}")
        _check_positive_int("fit samples", self.fit_samples)

    def _check_serving(self) -> None:
        """Phase serving's batcher delay, load points, latency bound and port."""
        for name, value, top in (
            ("max queue delay", self.serve_max_delay_s, 1.0),
            ("p99 bound", self.serve_p99_bound_s, 60.0),
            ("load point duration", self.serve_point_s, 600.0),
        ):
            if not _is_number_in(value, 0, top):
                raise SpecError(f"{name} must be a number of seconds from 0 to {top:g}, got {value!r}")
        if self.serve_point_s < 0.1 or self.serve_p99_bound_s <= 0:
            raise SpecError("a load point lasts at least 0.1 s and the p99 bound is above 0")
        if (
            not isinstance(self.serve_port, int)
            or isinstance(self.serve_port, bool)
            or not 0 <= self.serve_port < 65536
        ):
            raise SpecError(f"port must be an integer from 0 to 65535, got {self.serve_port!r}")

    def _check_fit(self) -> None:
        """Phase fit's epochs (epoch 1 compiles) and logging folder."""
        if self.epochs < 2:
            raise SpecError(f"epochs must be at least 2 (epoch 1 includes compilation), got {self.epochs}")
        if self.fit_logging is not None and (not isinstance(self.fit_logging, str) or not self.fit_logging):
            raise SpecError(f"fit logging must be a directory path, got {self.fit_logging!r}")

    def _check_timing(self) -> None:
        """A cell's time limits, its CI target and block time, and its warm-up."""
        for name, value in (
            ("max time", self.max_time_s),
            ("timeout", self.timeout_s),
            ("target relative CI", self.target_rel_ci),
            ("min block time", self.min_block_s),
        ):
            if not _is_number_in(value, 0, math.inf, low_open=True, high_open=True):
                raise SpecError(f"{name} must be a positive finite number, got {value!r}")
        if self.max_time_s >= self.timeout_s:
            raise SpecError(f"max time {self.max_time_s:g} s must be below the timeout {self.timeout_s:g} s")
        if self.warmup_calls < 2:
            raise SpecError(f"warm-up calls must be at least 2, got {self.warmup_calls}")

    def _check_limits(self) -> None:
        """The worker's memory limit and the seed."""
        limit = self.memory_limit_bytes
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or not 0 < limit < 2**63):
            raise SpecError(f"memory limit must be a positive number of bytes below 2**63, got {limit!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or not 0 <= self.seed < 2**63:
            raise SpecError(f"seed must be a non-negative integer, got {self.seed!r}")

    @property
    def round_limit(self) -> int:
        """The most rounds a comparison group runs: ``max_rounds``, never fewer than ``rounds``."""
        return max(self.max_rounds, self.rounds)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Settings:
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data})


def rank_threads(case: Case, settings: Settings) -> int:
    """Threads of each process of ``case``: ``settings.rank_threads`` when set, else ``settings.threads`` split
    evenly over the cell's processes (SpecError when they do not divide it); ``settings.threads`` for a cell of one
    worker."""
    if case.procs is None:
        return settings.threads
    if settings.rank_threads is not None:
        return settings.rank_threads
    if settings.threads % case.procs:
        raise SpecError(
            f"--threads {settings.threads} is a cell's total budget and {case.procs} processes do not divide it "
            "(give a multiple, or --rank-threads)"
        )
    return settings.threads // case.procs


def cell_threads(case: Case, settings: Settings) -> int:
    """Threads the whole cell uses: every process's together."""
    return rank_threads(case, settings) * (case.procs or 1)


def node_procs(case: Case, settings: Settings) -> int:
    """Processes of ``case`` on each machine it runs on (:func:`processes_per_node` over ``settings.nodes``)."""
    return processes_per_node(case.procs or 1, settings.nodes)


def processes_per_node(procs: int, nodes: int) -> int:
    """Processes on each machine of a cell of ``procs`` over ``nodes`` machines: ``procs / nodes`` for a cell of
    several processes (SpecError when they do not divide), else all of them (a cell of one process runs on node 0)."""
    if procs == 1 or nodes == 1:
        return procs
    if procs % nodes:
        raise SpecError(
            f"--procs {procs} spreads over --nnodes {nodes} machines evenly: give a multiple of "
            f"{nodes} (or 1, which runs on node 0)"
        )
    return procs // nodes


def node_threads(case: Case, settings: Settings) -> int:
    """Threads the cell uses on each machine it runs on (all of them on one machine)."""
    return rank_threads(case, settings) * node_procs(case, settings)


@dataclass(frozen=True)
class SkippedCase:
    """A case the plan keeps but will not run (stored as ``skipped`` with its reason)."""

    case: Case
    reason: str


GROUP_FIELDS = ("model", "phase", "batch_size", "seq_len", "dtype", "device", "workers", "scaling")
OPTIONAL_GROUP_FIELDS = ("workers", "scaling")  # in a group key only where the cell has them


def group_key(case: Case) -> str:
    """The key of ``case``'s comparison group: everything but the runtime and a distributed cell's process count
    (so the 1-process and N-process cells of one batch and scaling are measured interleaved, as scaling efficiency
    needs); the worker count and scaling only where a cell has them, so other cells' keys read as they did before
    they existed."""
    return "|".join(
        f"{name}={getattr(case, name)}"
        for name in GROUP_FIELDS
        if not (name in OPTIONAL_GROUP_FIELDS and getattr(case, name) is None)
    )


@dataclass(frozen=True)
class ShardSpec:
    """Shards ``indices`` (1-based) of ``count``: the plan's comparison groups ordered by the SHA-256 of their key
    and dealt round-robin, so shards are disjoint, together cover the plan, and differ by at most one group.
    Written ``I/N`` (``run --shard``), or ``1,3/4`` for the shards a merged run holds so far."""

    indices: frozenset[int]
    count: int

    def __post_init__(self) -> None:
        if self.count < 1 or not self.indices or not all(1 <= i <= self.count for i in self.indices):
            raise SpecError(f"--shard {self}: want I/N with 1 <= I <= N")

    @classmethod
    def one(cls, index: int, count: int) -> ShardSpec:
        return cls(frozenset({index}), count)

    @classmethod
    def parse(cls, text: str) -> ShardSpec:
        indices, slash, count = text.partition("/")
        try:
            if not slash:
                raise ValueError
            return cls(frozenset(int(i) for i in indices.split(",")), int(count))
        except ValueError:
            raise SpecError(f"--shard {text!r}: want I/N, e.g. 1/2") from None

    def __str__(self) -> str:
        return f"{','.join(map(str, sorted(self.indices)))}/{self.count}"

    @property
    def complete(self) -> bool:
        """Whether these shards together are the whole plan."""
        return len(self.indices) == self.count

    def holds(self, keys: Sequence[str]) -> set[str]:
        """The group keys among ``keys`` (every group of one plan) that fall in these shards."""
        ordered = sorted(set(keys), key=lambda key: (hashlib.sha256(key.encode()).hexdigest(), key))
        return {key for position, key in enumerate(ordered) if position % self.count + 1 in self.indices}


@dataclass(frozen=True)
class Plan:
    """The cases of one run, in order, and the settings they share."""

    cases: tuple[Case, ...]
    settings: Settings
    skipped: tuple[SkippedCase, ...] = ()
    suite: str | None = None

    def __post_init__(self) -> None:
        keys = [c.key for c in self.cases] + [s.case.key for s in self.skipped]
        if len(keys) != len(set(keys)):
            raise SpecError("a plan may not hold the same case twice")

    @property
    def size(self) -> int:
        return len(self.cases) + len(self.skipped)

    @property
    def digest(self) -> str:
        """The plan's identity: the SHA-256 (hex) of its JSON; the shards of one plan share it."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()

    def shard(self, spec: ShardSpec | None) -> Plan:
        """The cases (run and skipped) of the comparison groups in shard ``spec``, in plan order; the whole plan for
        None."""
        if spec is None:
            return self
        keys = [group_key(c) for c in self.cases] + [group_key(s.case) for s in self.skipped]
        held = spec.holds(keys)
        return dataclasses.replace(
            self,
            cases=tuple(c for c in self.cases if group_key(c) in held),
            skipped=tuple(s for s in self.skipped if group_key(s.case) in held),
        )

    def to_json(self) -> str:
        return json.dumps(
            {
                "suite": self.suite,
                "settings": self.settings.to_dict(),
                "cases": [c.to_dict() for c in self.cases],
                "skipped": [{"case": s.case.to_dict(), "reason": s.reason} for s in self.skipped],
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> Plan:
        data = json.loads(text)
        return cls(
            cases=tuple(Case.from_dict(c) for c in data["cases"]),
            settings=Settings.from_dict(data["settings"]),
            skipped=tuple(SkippedCase(Case.from_dict(s["case"]), s["reason"]) for s in data["skipped"]),
            suite=data.get("suite"),
        )

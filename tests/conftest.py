"""Shared fixtures: a temp database, the test plugin's environment, framework caches in a temp dir; each
pytest-xdist process pinned to its own core; ``FWBENCH_TEST_ISA=avx2`` caps every framework to AVX2."""

from __future__ import annotations

import importlib
import importlib.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import pytest

TESTS_DIR = Path(__file__).resolve().parent
REPO_DIR = TESTS_DIR.parent
sys.path.append(str(REPO_DIR / "benchmarks"))  # tests import the benchmarks' helpers (ray_cluster.py) by name

# FWBENCH_TEST_ISA=avx2: every framework computes with AVX2 kernels only, even on an AVX-512 / AVX512_BF16 / AMX
# CPU, so one machine runs the numeric tests both ways (`make test-avx2`). Set before any framework is imported,
# here and (inherited) in every worker and subprocess the tests start.
ISA_CAPS = {
    "avx2": {
        "ATEN_CPU_CAPABILITY": "avx2",  # PyTorch's own kernels
        "ONEDNN_MAX_CPU_ISA": "AVX2",  # oneDNN, in PyTorch (and in TensorFlow where it is on)
        "DNNL_MAX_CPU_ISA": "AVX2",  # the same cap under oneDNN's older name
        # TensorFlow turns its oneDNN ops on by default only on CPUs with VNNI, AVX512_BF16 or AMX
        # (DefaultOneDnnPolicy, tensorflow/core/util/port.cc): an AVX2 CPU runs Eigen's kernels. Capped oneDNN on
        # an AMX CPU would instead abort on a bf16 MatMul ("could not create a primitive descriptor").
        "TF_ENABLE_ONEDNN_OPTS": "0",
        "XLA_FLAGS": " ".join(filter(None, [os.environ.get("XLA_FLAGS"), "--xla_cpu_max_isa=AVX2"])),  # JAX, TF XLA
    }
}
_isa = os.environ.get("FWBENCH_TEST_ISA")
if _isa:
    if _isa not in ISA_CAPS:
        raise pytest.UsageError(f"FWBENCH_TEST_ISA={_isa!r}: allowed: {', '.join(ISA_CAPS)}")
    os.environ.update(ISA_CAPS[_isa])


def _pin_xdist_worker() -> None:
    """Under pytest-xdist, pin this test process (and so every fwbench worker it starts, which picks its CPUs
    from the affinity it inherits) to a core of its own: ``gwN`` takes the N-th CPU of a one-per-physical-core
    list. Without this every ``threads=1`` worker of every xdist process would pin itself to the same CPU 0."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw"):
        return
    from fwbench.measure.environment import cpus_one_per_core

    cpus = cpus_one_per_core()
    os.sched_setaffinity(0, {cpus[int(worker[2:]) % len(cpus)]})


_pin_xdist_worker()


# Tests that share one expensive computation go to one xdist process (``--dist loadgroup``), or each process that
# runs one of them computes it again: a module-scoped fixture by its name, and tests/test_training.py's per-runtime
# report parts (subprocesses that train the tiny models, cached for every test of that runtime and part).
SHARED_FIXTURE_GROUPS = {"reports": "keras-reports", "fit_db": "fit-mlp", "resnet_fit": "fit-resnet"}


def xdist_group_of(item: pytest.Item) -> str | None:
    """The xdist group an expensive-to-set-up test belongs to, None for any other test."""
    callspec = getattr(item, "callspec", None)
    if item.path.name == "test_training.py" and callspec is not None and "runtime" in callspec.params:
        part = callspec.params.get("part", "matrix" if item.get_closest_marker("matrix") else "default")
        return f"training-{callspec.params['runtime']}-{part}"
    shared = [
        SHARED_FIXTURE_GROUPS[name] for name in getattr(item, "fixturenames", ()) if name in SHARED_FIXTURE_GROUPS
    ]
    return shared[0] if shared else None


# The files whose tests (or shared fixtures) keep framework subprocesses busy longest go first (make test's single
# longest tests, then the report groups that make test-matrix makes longest): xdist hands out work in collection
# order, so the short tests fill the end of the run instead of one long test or group keeping a core busy alone.
LONG_FILES = (
    "test_diff.py",
    "test_tfjs.py",
    "test_end_to_end.py",
    "test_data_phase.py",
    "test_training.py",
    "test_fit.py",
    "test_keras_models.py",
    "test_deploy.py",
    "test_compiled_runtimes.py",
    "test_profile.py",
)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the markers into the node ids it schedules by
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        group = xdist_group_of(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    order = {name: i for i, name in enumerate(LONG_FILES)}
    items.sort(key=lambda item: order.get(item.path.name, len(LONG_FILES)))  # stable: file order kept otherwise


@pytest.fixture(scope="session", autouse=True)
def _framework_caches(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Keep inductor, XLA and Keras caches out of the home folder (workers inherit this), in one folder of this test
    run that its xdist processes share (the run's base temporary folder; each process's own is popen-gwN in it): a
    graph inductor compiled for a test in one process is a cache hit for a test in the other. Every test already meets
    both a cold and a warm cache, whatever tests ran before it in its own process; a new run starts empty."""
    base = tmp_path_factory.getbasetemp()
    cache = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "framework-cache"
    cache.mkdir(exist_ok=True)
    saved = dict(os.environ)
    os.environ.update(
        TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"),
        KERAS_HOME=str(cache / "keras"),
        XDG_CACHE_HOME=str(cache / "xdg"),
        TF_CPP_MIN_LOG_LEVEL="1",
    )
    yield
    os.environ.clear()
    os.environ.update(saved)


def _name_plugin(monkeypatch: pytest.MonkeyPatch, module: str) -> None:
    """Make the test-only plugin ``module`` (in tests/) importable and named in $FWBENCH_PLUGINS, here and in every
    subprocess."""
    path = os.pathsep.join(filter(None, [str(TESTS_DIR), str(REPO_DIR), os.environ.get("PYTHONPATH")]))
    monkeypatch.setenv("PYTHONPATH", path)
    monkeypatch.setenv("FWBENCH_PLUGINS", module)
    monkeypatch.syspath_prepend(str(TESTS_DIR))


def load_fake_runtimes(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Load the test-only fake runtimes here and in every worker, until ``monkeypatch`` is undone; the environment."""
    _name_plugin(monkeypatch, "fwbench_test_plugin")
    import fwbench.plugins

    monkeypatch.setattr(fwbench.plugins, "_loaded", False)
    fwbench.plugins.load_plugins()
    return dict(os.environ)


@pytest.fixture
def plugin_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Load the test-only fake runtimes here and in every worker (for one test)."""
    return load_fake_runtimes(monkeypatch)


# The test plugins that register models (fwbench_gelu_model imports fwbench_plugin_model): their registrations last
# only as long as the test that loads them.
MODEL_PLUGINS = ("fwbench_plugin_model", "fwbench_gelu_model", "fwbench_faulty_models", "fwbench_cache_defect")


def _forget_model_plugins() -> None:
    for name in [n for n in sys.modules if n.split(".", 1)[0] in MODEL_PLUGINS]:
        del sys.modules[name]


def loaded_model_plugin(monkeypatch: pytest.MonkeyPatch, module: str) -> Iterator[dict[str, str]]:
    """For a fixture: the model plugin ``module`` imported afresh here (the model and runtime registries restored
    afterwards) and named for every subprocess; yields the environment a subprocess gets."""
    import fwbench.frameworks.registry as registry
    import fwbench.models as models
    import fwbench.plugins

    _name_plugin(monkeypatch, module)
    monkeypatch.setattr(models, "MODELS", dict(models.MODELS))
    monkeypatch.setattr(registry, "_RUNTIMES", dict(registry._RUNTIMES))
    monkeypatch.setattr(fwbench.plugins, "_loaded", False)
    _forget_model_plugins()
    fwbench.plugins.load_plugins()
    yield dict(os.environ)
    _forget_model_plugins()


NEED_EXTRAS_ENV = "FWBENCH_TESTS_NEED_EXTRAS"  # "all": make test installed every extra, so none may be missing


def require(module: str) -> ModuleType:
    """``module`` imported, for a test of an optional framework (``pytest.importorskip`` that tells a broken install
    from a missing one): the test is skipped when the module's package is not installed (its fwbench extra was left
    out), and fails with the import error when the package is there but does not import, where importorskip would
    skip it silently. Under ``make test`` (``FWBENCH_TESTS_NEED_EXTRAS=all``: it installs every extra) a package
    that is not installed fails the test too: the install is broken."""
    try:
        found = importlib.util.find_spec(module.partition(".")[0]) is not None  # the package, without importing it
    except ValueError:  # in sys.modules without a spec (a stand-in a test put there): there to import
        found = True
    if not found and os.environ.get(NEED_EXTRAS_ENV) == "all":
        pytest.fail(f"{module} is not installed, but ${NEED_EXTRAS_ENV}=all: every extra should be (a broken install)")
    if not found:
        pytest.skip(f"{module} is not installed (an optional extra of fwbench)")
    try:
        return importlib.import_module(module)
    except Exception as exc:
        pytest.fail(f"{module} is installed but does not import: {type(exc).__name__}: {exc}")


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "results" / "fwbench.db"


JAX_WORKER_ENV = ("XLA_FLAGS", "XLA_PYTHON_CLIENT_PREALLOCATE")  # what importing the JAX backend sets for a worker


def import_jax_backend() -> ModuleType:
    """``fwbench.frameworks.jax.backend``, imported without leaving the XLA variables it sets for a worker
    (JAX_WORKER_ENV) in this test process's environment, and so in the workers other tests start."""
    saved = {name: os.environ.get(name) for name in JAX_WORKER_ENV}
    try:
        import fwbench.frameworks.jax.backend as backend
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return backend


def fwbench_here(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``fwbench ARGS`` in this process (``fwbench.cli.main``: no interpreter start; a run's workers are processes of
    their own all the same, with this process's environment): the exit status, stdout and stderr. For a test of what
    a command does, not of a process's isolation (that one: :func:`run_cli`)."""
    from fwbench.cli import main

    capsys.readouterr()  # what came before
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@contextmanager
def ended_on_exit(process: subprocess.Popen[str]) -> Iterator[subprocess.Popen[str]]:
    """``process`` (started with ``start_new_session=True``), its whole process group SIGKILLed on the way out if it
    is still running, also when the test fails; its pipes read to the end."""
    try:
        yield process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.communicate()


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``python -m fwbench ARGS`` in a subprocess, as a user would run it."""
    return subprocess.run(
        [sys.executable, "-m", "fwbench", *args], capture_output=True, text=True, env=env, timeout=timeout, cwd=REPO_DIR
    )


def run_args(
    *flags: str, db: Path | str, rounds: int = 1, threads: int | None = 1, max_time: float | None = None
) -> list[str]:
    """The arguments of ``fwbench run FLAGS`` as most tests give them (for ``run_cli(*run_args(...))`` or
    ``main(run_args(...))``): ``--rounds 1`` (one worker per cell: a test not about the statistics), ``--threads 1``
    (None: left to the default), ``--max-time`` when given, and the database ``db``."""
    args = ["run", *flags, "--rounds", str(rounds)]
    if threads is not None:
        args += ["--threads", str(threads)]
    if max_time is not None:
        args += ["--max-time", str(max_time)]
    return [*args, "--db", str(db)]


LOOPBACK = ("127.0.0.1", "::1", "::ffff:127.0.0.1")


def listening_off_loopback(pids: set[int]) -> list[str]:
    """TCP sockets listening on anything but loopback that belong to ``pids`` (what `ss -ltnp` shows, from psutil)."""
    import psutil

    bad = []
    for conn in psutil.net_connections("tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.pid in pids and conn.laddr.ip not in LOOPBACK:
            bad.append(f"{conn.laddr.ip}:{conn.laddr.port} (pid {conn.pid})")
    return bad


MARKER_ENV = "FWBENCH_TEST_MARKER"  # set on a command a test starts: every process it starts inherits it


def marked_processes_left(marker: str, wait_s: float = 10.0) -> list[int]:
    """The live processes whose environment has ``FWBENCH_TEST_MARKER=marker``, once none is left or after
    ``wait_s`` (a killed process group takes a moment to be reaped)."""
    import psutil

    deadline = time.monotonic() + wait_s
    while True:
        left = []
        for process in psutil.process_iter():
            try:
                if process.environ().get(MARKER_ENV) == marker and process.status() != "zombie":
                    left.append(process.pid)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)

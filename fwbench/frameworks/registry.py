"""The runtime registry's logic: :class:`RuntimeInfo` (a runtime and what it can do, known without importing its
framework), registration, lookups, whether a runtime can run here, and :func:`create_backend`, the one place a
backend module is imported, by name. The built-in records are data, in :mod:`fwbench.frameworks.catalog`.

This module never imports a framework: availability is decided with ``importlib.util.find_spec``.
Third-party backends register through the ``fwbench.plugins`` entry-point group or the
``FWBENCH_PLUGINS`` environment variable (comma-separated module names); a plugin module calls
:func:`register_runtime` when imported.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from dataclasses import dataclass

from fwbench.frameworks.base import Backend, UnsupportedDtype
from fwbench.frameworks.roles import (
    BUILTIN_PACKAGE,
    ArchModule,
    FitModule,
    LoaderModule,
    PackingLoaderModule,
    arch_module_name,
    as_loader,
    as_packing_loader,
    builtin_package,
    import_arch,
    import_fit,
)
from fwbench.plugins import load_plugins
from fwbench.spec import Settings, SpecError


@dataclass(frozen=True)
class RuntimeInfo:
    """A runtime and what it can do, known without importing its framework.

    ``name`` is ``framework:mode``; ``module`` defines ``create_backend(mode, device, settings, *, dtype, phase)``
    (dtype: a spec.Dtype, "fp32" by default; phase: a spec.Phase, "inference" by default). ``package`` is the
    framework package holding the model files (``<package>/<arch>.py``, ``weights.py``, ``fit.py``; see
    :mod:`fwbench.frameworks.roles` for what each provides); empty: ``fwbench.frameworks.<framework>``."""

    name: str
    module: str
    requires: tuple[str, ...]
    description: str
    note: str = ""
    # The phases this runtime's backend implements, with what one timed training call is (by phase).
    phases: tuple[str, ...] = ("inference",)
    training: str = ""
    fit: str = ""  # phase fit: the training loop it runs (<package>/fit.py)
    data: str = ""  # phase data: the input pipeline it times (<package>/data.py; such a runtime has no backend)
    fit_loader: str = ""  # phase fit from images (--input): the loader runtime its fit loop reads through
    dtypes: tuple[str, ...] = ("fp32",)  # the case dtypes (spec.Dtype) it computes in
    native: bool = False  # its framework's own, plainest fast runtime (one per framework)
    extras: tuple[str, ...] = ()  # the fwbench pip extras that install ``requires``; empty: (framework,)
    startup_s: float = 2.0  # seconds to start a worker and import the framework (2-core AMD EPYC, warm cache)
    # The estimate's call time (fwbench.runner.estimate): the share of the nominal FLOP/s per thread the runtime
    # reaches, and the threads it computes on whatever --threads is (None: all of them).
    throughput_share: float = 1.0
    threads_used: int | None = None
    compile_s: float = 0.0  # seconds the mode compiles a small model before or in its first call
    package: str = ""
    # What ``fwbench export`` writes for it (a deployment artefact, in words; its path must end in
    # ``artefact_suffix`` when that is set); empty: the runtime writes none.
    artefact: str = ""
    artefact_suffix: str = ""
    # A data-parallel runtime: how its processes cooperate (launcher, collectives); its cells run as ``Case.procs``
    # processes (--procs), and only such runtimes do. Empty: a runtime of one process.
    distributed: str = ""
    # A data-parallel runtime whose batch norm normalises over the global batch (synchronised statistics), so its N
    # processes take the 1-process step for ResNet too; False: each process's rows are normalised on their own.
    global_batch_norm: bool = False
    # A runtime of one process whose fit loop users would run as several processes but cannot today: its phase fit
    # --procs cells are stored as skipped with this reason (instead of refused as a one-process runtime's).
    procs_unsupported: str = ""
    # Why the runtime cannot run anywhere today (listed by ``fwbench list`` with this reason, refused in a plan).
    unavailable: str = ""
    # A worker in another language: the Python module that says whether it can run here (``missing()``, beside
    # ``requires``), whether it has a model file for an architecture (``missing_model(arch)``), and writes what it
    # reads before the cell's worker process becomes it (``prepare(job, folder)`` → its command line;
    # fwbench.runner.external). Empty: the Python worker runs the cell with ``module``'s backend.
    external: str = ""
    # A loader runtime (phase data) that reads a packed format of the images when --data-source packed: what
    # ``fwbench data make`` packs them into for it (words: "TFRecord shards"; its data.py writes them). Empty: it reads
    # the image files either way.
    packed: str = ""
    # False: the runtime builds no model of a framework (the serving floor echoes its inputs): every model is its.
    model_files: bool = True
    # An inference runtime without phase generate: why (``fwbench list`` shows it; a plan's refusal says it).
    no_generate: str = ""

    @property
    def framework(self) -> str:
        return self.name.split(":", 1)[0]

    @property
    def mode(self) -> str:
        return self.name.split(":", 1)[1]

    @property
    def framework_package(self) -> str:
        """The package of this runtime's model files."""
        return self.package or builtin_package(self.framework)

    @property
    def install_hint(self) -> str:
        """The pip command that installs what this runtime requires."""
        return f"pip install 'fwbench[{','.join(self.extras or (self.framework,))}]'"


_RUNTIMES: dict[str, RuntimeInfo] = {}


def register_runtime(info: RuntimeInfo) -> None:
    """Add a runtime to the registry (plugins call this on import)."""
    if ":" not in info.name:
        raise ValueError(f"runtime name must be framework:mode, got {info.name!r}")
    _RUNTIMES[info.name] = info


def builtin_module(framework: str, role: str) -> str:
    """The module of a built-in runtime: ``fwbench.frameworks.<framework>.<role>`` (``backend``; ``data`` for a
    loader runtime, phase data)."""
    return f"{BUILTIN_PACKAGE}.{framework}.{role}"


def distributed_runtimes() -> tuple[str, ...]:
    """The data-parallel runtimes (those whose cells run as several processes), in registry order."""
    return tuple(name for name, info in runtimes().items() if info.distributed and not info.unavailable)


def dtype_unsupported(info: RuntimeInfo, dtype: str) -> str | None:
    """None when the runtime can compute in ``dtype``, else why not (the one place a runtime's dtypes are decided;
    which dtypes a phase takes is the phase's, :meth:`fwbench.runner.phases.Phase.dtype_unsupported`)."""
    if dtype not in info.dtypes:
        return f"{info.name} cannot compute in {dtype} (it computes in {', '.join(info.dtypes)})"
    return None


def fit_input_unsupported(info: RuntimeInfo) -> str | None:
    """None when the runtime's fit loop can read the data phase's images (--phase fit --input), else why not."""
    if info.fit_loader:
        return missing_requirement(get_runtime(info.fit_loader))
    readers = ", ".join(i.name for i in runtimes().values() if i.fit_loader)
    return f"{info.name}'s fit loop does not read --input images yet (these do: {readers})"


def native_runtime(framework: str) -> str | None:
    """The name of ``framework``'s native runtime (torch:eager, tensorflow:function, jax:jit), None if it has none."""
    return next((info.name for info in runtimes().values() if info.native and info.framework == framework), None)


def native_runtimes() -> tuple[str, ...]:
    """Every framework's native runtime, in registry order."""
    return tuple(info.name for info in runtimes().values() if info.native)


def runtimes() -> dict[str, RuntimeInfo]:
    """Every registered runtime, built-in first, by name."""
    load_plugins()
    return dict(_RUNTIMES)


def get_runtime(name: str) -> RuntimeInfo:
    """The runtime called ``name``; SpecError listing the known ones otherwise."""
    known = runtimes()
    if name not in known:
        raise SpecError(f"unknown runtime {name!r}; allowed: {', '.join(known)}")
    return known[name]


def missing_requirement(info: RuntimeInfo) -> str | None:
    """None when the runtime's packages are installed, else why it cannot run (nothing imported); a runtime that
    cannot run anywhere today says why (``unavailable``)."""
    if info.unavailable:
        return f"not available: {info.unavailable}"
    for package in info.requires:
        if importlib.util.find_spec(package) is None:
            return f"{package} is not installed ({info.install_hint})"
    if info.external:
        missing: str | None = importlib.import_module(info.external).missing()
        return missing
    return None


def _model_files_checked(info: RuntimeInfo) -> bool:
    """Whether the runtime builds models from its package's model files: every built-in runtime and every
    plugin runtime that names its package (others, such as test doubles, build their models themselves); not a
    runtime that builds none (``model_files`` False)."""
    return info.model_files and (bool(info.package) or info.module.startswith(f"{builtin_package(info.framework)}."))


def missing_implementation(info: RuntimeInfo, arch: str) -> str | None:
    """None when the runtime's framework package (or a registered model, for it) has a model file for ``arch``,
    else why not. Plugin runtimes that name no package are not checked. No framework is imported (a plugin
    package's ``__init__`` is)."""
    if info.external:
        missing: str | None = importlib.import_module(info.external).missing_model(arch)
        return missing
    if not _model_files_checked(info):
        return None
    try:
        found = importlib.util.find_spec(arch_module_name(info.framework_package, arch)) is not None
    except ModuleNotFoundError:  # a parent package is missing
        found = False
    return None if found else f"no {info.framework} implementation of {arch} yet"


def arch_module(info: RuntimeInfo, arch: str) -> ArchModule:
    """The runtime's checked model file for ``arch`` (imports its framework: worker only)."""
    return import_arch(info.framework_package, arch)


def fit_module(info: RuntimeInfo) -> FitModule:
    """The runtime's checked ``fit.py`` (imports its framework: worker only)."""
    return import_fit(info.framework_package)


def import_runtime(runtime: str) -> None:
    """Import the runtime's backend module, and so its framework (what :func:`create_backend` does first)."""
    importlib.import_module(get_runtime(runtime).module)


def create_backend(
    runtime: str, device: str, settings: Settings, *, dtype: str = "fp32", phase: str = "inference"
) -> Backend:
    """Import the runtime's backend module (and so its framework) and make the backend for ``dtype`` and
    ``phase`` (spec.Phase). A plugin module whose ``create_backend`` predates the ``phase`` keyword is
    called without it and gets ``backend.phase`` set before it is returned (before build)."""
    info = get_runtime(runtime)
    refused = dtype_unsupported(info, dtype)
    if refused:
        raise UnsupportedDtype(refused)
    module = importlib.import_module(info.module)
    if "phase" in inspect.signature(module.create_backend).parameters:
        backend: Backend = module.create_backend(info.mode, device, settings, dtype=dtype, phase=phase)
    else:
        backend = module.create_backend(info.mode, device, settings, dtype=dtype)
        backend.phase = phase
    if info.package:
        backend.package = info.package
    return backend


def loader_module(info: RuntimeInfo) -> LoaderModule:
    """A loader runtime's checked ``data.py`` (phase data; imports its framework: in the process that reads)."""
    return as_loader(importlib.import_module(info.module))


def packing_loader_module(info: RuntimeInfo) -> PackingLoaderModule:
    """A loader runtime's ``data.py`` that writes its packed format (``info.packed``; imports its framework)."""
    return as_packing_loader(importlib.import_module(info.module))

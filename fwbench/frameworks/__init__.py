"""The runtime registry: ``framework:mode`` names, where each backend lives, whether it is installed.

:mod:`.registry` holds its logic, :mod:`.catalog` the built-in runtimes' records (registered on import); this
package's namespace is the registry's interface. No framework is imported here: a backend module is imported by
name, by :func:`create_backend` (and the model-file lookups), in the worker that runs it.
"""

from __future__ import annotations

from fwbench.frameworks import catalog  # noqa: F401  (registers the built-in runtimes)
from fwbench.frameworks.registry import (
    RuntimeInfo,
    arch_module,
    builtin_module,
    create_backend,
    distributed_runtimes,
    dtype_unsupported,
    fit_input_unsupported,
    fit_module,
    get_runtime,
    import_runtime,
    loader_module,
    missing_implementation,
    missing_requirement,
    native_runtime,
    native_runtimes,
    packing_loader_module,
    register_runtime,
    runtimes,
)
from fwbench.frameworks.roles import BUILTIN_PACKAGE, arch_module_name

__all__ = [
    "BUILTIN_PACKAGE",
    "RuntimeInfo",
    "arch_module",
    "arch_module_name",
    "builtin_module",
    "create_backend",
    "distributed_runtimes",
    "dtype_unsupported",
    "fit_input_unsupported",
    "fit_module",
    "get_runtime",
    "import_runtime",
    "loader_module",
    "missing_implementation",
    "missing_requirement",
    "native_runtime",
    "native_runtimes",
    "packing_loader_module",
    "register_runtime",
    "runtimes",
]

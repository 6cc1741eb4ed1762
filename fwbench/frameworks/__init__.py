"""The runtime registry: ``framework:mode`` names, where each backend lives, whether it is installed.

This module never imports a framework: availability is decided with ``importlib.util.find_spec``.
Third-party backends register through the ``fwbench.plugins`` entry-point group or the
``FWBENCH_PLUGINS`` environment variable (comma-separated module names); a plugin module calls
:func:`register_runtime` when imported.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from dataclasses import dataclass
from importlib import metadata
from typing import TYPE_CHECKING

from fwbench.spec import Settings, SpecError

if TYPE_CHECKING:
    from fwbench.frameworks.base import Backend

PLUGINS_ENV = "FWBENCH_PLUGINS"
PLUGIN_GROUP = "fwbench.plugins"


@dataclass(frozen=True)
class RuntimeInfo:
    """A runtime: ``name`` is ``framework:mode``; ``module`` defines
    ``create_backend(mode, device, settings, *, dtype)`` (dtype: a spec.Dtype, "fp32" by default)."""

    name: str
    module: str
    requires: tuple[str, ...]
    description: str
    note: str = ""
    # The phases this runtime's backend implements, with what one timed training call is (by phase).
    phases: tuple[str, ...] = ("inference",)
    training: str = ""
    fit: str = ""  # phase fit: the training loop it runs (fwbench/frameworks/<framework>/fit.py)

    @property
    def framework(self) -> str:
        return self.name.split(":", 1)[0]

    @property
    def mode(self) -> str:
        return self.name.split(":", 1)[1]


_RUNTIMES: dict[str, RuntimeInfo] = {}
_plugins_loaded = False


def register_runtime(info: RuntimeInfo) -> None:
    """Add a runtime to the registry (plugins call this on import)."""
    if ":" not in info.name:
        raise ValueError(f"runtime name must be framework:mode, got {info.name!r}")
    _RUNTIMES[info.name] = info


def _builtin(framework: str, mode: str, requires: tuple[str, ...], description: str, note: str = "",
             training: str = "", fit: str = "", inference: bool = True) -> None:
    """A built-in runtime; ``training`` (what one timed training call is) gives it phase training, ``fit``
    (the loop it runs) phase fit; ``inference=False`` for a runtime that only trains."""
    phases = (*(("inference",) if inference else ()), *(("training",) if training else ()),
              *(("fit",) if fit else ()))
    register_runtime(RuntimeInfo(f"{framework}:{mode}", f"fwbench.frameworks.{framework}.backend", requires,
                                 description, note, phases, training, fit))


def phase_unsupported(info: RuntimeInfo, phase: str) -> str | None:
    """None when the runtime implements ``phase``, else why not."""
    return None if phase in info.phases else f"{info.name} has no {phase} phase yet"


_builtin("torch", "eager", ("torch",), "nn.Module called under torch.inference_mode()",
         training="zero_grad, forward + loss, loss.backward(), torch.optim step, eagerly",
         fit="manual DataLoader loop: for x, y in DataLoader(TensorDataset, batch_size, shuffle=False): zero_grad, "
         "forward + F.cross_entropy, backward, torch.optim step, eagerly")
_builtin("torch", "lightning", ("torch", "lightning"), "PyTorch Lightning (phase fit only)",
         fit="lightning Trainer.fit: a LightningModule (training_step, configure_optimizers) over the same "
         "DataLoader; accelerator cpu, 1 device, checkpointing, logger, progress bar and model summary off",
         inference=False)
_builtin("torch", "script", ("torch",), "torch.jit.trace + torch.jit.freeze of the nn.Module, under inference_mode",
         "TorchScript is deprecated upstream since PyTorch 2.9; kept because the 2019 study used it")
_builtin("torch", "compile", ("torch",), "torch.compile(fullgraph=True), inductor, mode from --compile-mode "
         "(default: default), under inference_mode",
         training="forward + loss compiled as one torch.compile(fullgraph=True) graph (AOTAutograd compiles its "
         "backward too), loss.backward() running that compiled backward, then the torch.optim step compiled by "
         "its own torch.compile (the optimizer step cannot share the graph: backward is in between)")
_builtin("torch", "export", ("torch",), "torch.export.export per cell shape, compiled ahead of time by AOTInductor "
         "(aoti_compile_and_package to a .pt2, loaded with aoti_load_package), all before the first call; "
         "the loaded runner's Python call is timed, under inference_mode",
         "TorchScript's successor for deployment")
_builtin("tensorflow", "eager", ("tensorflow",), "tf.Module of tf ops called eagerly",
         training="forward + loss under tf.GradientTape, then a Keras 3 optimizer's apply_gradients on the "
         "tf.Variables, eagerly")
_builtin(
    "tensorflow", "function", ("tensorflow",), "tf.function with the input signature fixed per cell (no retracing)",
    training="one tf.function: forward + loss under tf.GradientTape, gradients, a Keras 3 optimizer's "
    "apply_gradients on the tf.Variables",
    fit="manual custom loop: for x, y in tf.data.Dataset.from_tensor_slices(...).batch(batch_size): the "
    "tf.function step (GradientTape, a Keras 3 optimizer's apply_gradients)"
)
_builtin("tensorflow", "xla", ("tensorflow",), "tf.function(jit_compile=True) with the input signature fixed per cell",
         training="the tensorflow:function step under tf.function(jit_compile=True): tape, gradients and "
         "optimizer update in one XLA program")
_builtin("jax", "jit", ("jax",), "jax.jit of a pure function over a parameter pytree (weights passed as arguments)",
         training="one jax.jit of jax.value_and_grad(loss) + optax update + apply_updates, parameters and "
         "optimizer state donated and carried to the next call",
         fit="manual loop over numpy batch slices: the jitted value_and_grad + optax step, parameters and "
         "optimizer state donated and carried")
KERAS_FIT = ("keras model.fit(x, y, batch_size, epochs, shuffle=False, verbose=0) on numpy arrays after "
             "model.compile(optimizer, loss, jit_compile='auto')")
KERAS_TRAINING = ("model.train_on_batch(x, y, sample_weight) after model.compile(optimizer, loss, "
                  "jit_compile='auto'), the loss returned as a Python float: ")
_builtin("keras", "tensorflow", ("keras", "tensorflow"),
         "Keras 3 on TensorFlow: model.predict_function([(x,)]) after model.compile(jit_compile='auto'); "
         "a tf.function, XLA only on a GPU",
         training=KERAS_TRAINING + "a tf.function train step (XLA only on a GPU)", fit=KERAS_FIT)
_builtin("keras", "jax", ("keras", "jax"),
         "Keras 3 on JAX: model.predict_function(state, iter([(x,)])) after model.compile(jit_compile='auto'); "
         "jax.jit of the stateless predict step, variables donated and the returned state carried to the next call",
         training=KERAS_TRAINING + "jax.jit of the stateless train step; train_on_batch writes the state back "
         "into the variables after each call", fit=KERAS_FIT)
_builtin("keras", "torch", ("keras", "torch"),
         "Keras 3 on PyTorch: model.predict_function([(x,)]) after model.compile(jit_compile='auto'); "
         "eager under torch.no_grad (auto never picks torch.compile)",
         training=KERAS_TRAINING + "eager forward, backward and optimizer step (auto never picks torch.compile)",
         fit=KERAS_FIT)


def load_plugins() -> None:
    """Import plugin modules named by entry points and by $FWBENCH_PLUGINS (once per process)."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    for entry_point in metadata.entry_points(group=PLUGIN_GROUP):
        entry_point.load()
    for name in filter(None, (n.strip() for n in os.environ.get(PLUGINS_ENV, "").split(","))):
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise SpecError(f"cannot import plugin module {name!r} named in ${PLUGINS_ENV}: {exc}") from None


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
    """None when the runtime's packages are installed, else why it cannot run (nothing imported)."""
    for package in info.requires:
        if importlib.util.find_spec(package) is None:
            return f"{package} is not installed (pip install 'fwbench[{info.framework}]')"
    return None


def missing_implementation(info: RuntimeInfo, arch: str) -> str | None:
    """None when a built-in runtime's framework has a ``<arch>.py`` implementation, else why not.

    Plugins build their models themselves and are not checked. Nothing is imported.
    """
    if not info.module.startswith(f"fwbench.frameworks.{info.framework}."):
        return None
    if importlib.util.find_spec(f"fwbench.frameworks.{info.framework}.{arch}") is None:
        return f"no {info.framework} implementation of {arch} yet"
    return None


def create_backend(runtime: str, device: str, settings: Settings, *, dtype: str = "fp32") -> Backend:
    """Import the runtime's backend module (and so its framework) and make the backend for ``dtype``."""
    info = get_runtime(runtime)
    module = importlib.import_module(info.module)
    backend: Backend = module.create_backend(info.mode, device, settings, dtype=dtype)
    return backend

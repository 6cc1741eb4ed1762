"""What a framework's model files provide, and where they are: one ``typing.Protocol`` per role, checked by
:func:`require` (which names the module and each missing attribute) and the ``as_*`` accessors, and the look-ups
that import a package's model files by name (:func:`import_arch`, :func:`import_fit`, ...). No framework is imported
here; the lookups import a framework's files, so only a worker calls them.

A framework's model files live in its package (``fwbench/frameworks/<framework>/`` for the built-in ones,
``RuntimeInfo.package`` for a plugin's) with the same file names in every package: ``backend.py`` (the
:class:`fwbench.frameworks.base.Backend`), ``weights.py`` (:class:`WeightsModule`), ``fit.py`` (:class:`FitModule`),
``deploy.py`` where other engines run its exports (:class:`OnnxExporter`, :class:`TfliteExporter`), ``profile.py``
(:class:`ProfilerModule`), ``data.py`` for a loader (:class:`LoaderModule`) and one file per model architecture
(``mlp.py``, ...: :class:`ArchModule`, plus the training roles the framework's backend uses). A model registered by
a plugin may name its own module per framework package (``ModelDescription.implementations``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Generator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol, cast

import numpy as np

from fwbench.models import implementations
from fwbench.models.fit import EpochEnd

BUILTIN_PACKAGE = "fwbench.frameworks"


# -- what a model file provides ---------------------------------------------------------------------
class ArchModule(Protocol):
    """``<package>/<arch>.py``: the inference model of an architecture (every framework)."""

    def build_model(self, description: Any, weights: dict[str, np.ndarray], device: str) -> Any:
        """The model of ``description`` (a ModelDescription of this arch) holding the canonical ``weights``
        (loaded through :mod:`fwbench.models.weightmap`: a checked name map or its ``WeightTaker``),
        on ``device`` ("cpu" or "cuda"); called with the description's inputs it returns its outputs in
        ``description.output_names`` order."""


class LaidOutArch(Protocol):
    """An image architecture that says which memory layout it computes in (optional role; the canonical
    inputs are NCHW)."""

    LAYOUT: str


class TrainingArch(Protocol):
    """The training forward of an architecture (torch, tensorflow, jax; phases training and fit)."""

    def training_logits(self, model: Any, *args: Any) -> Any:
        """The logits the loss takes, (..., classes). torch and tensorflow: ``(model, *inputs)``; jax:
        ``(model, params, *inputs)``, pure in ``params``."""


class CachedDecoderArch(Protocol):
    """A causal decoder's key/value cache (phase generate; torch, tensorflow, jax): the cache of every layer for a
    whole generation, allocated once, and the forward of some positions that writes their keys and values into it
    (the framework's ``generate.py`` says how each is called)."""

    def new_cache(self, model: Any, batch: int, max_len: int) -> Any:
        """Every layer's keys and values for ``batch`` rows of ``max_len`` positions, zeros."""

    def cached_forward(self, model: Any, *args: Any) -> Any:
        """The token ids (batch, S) at positions start .. start + S - 1 through the model with the cache → the last
        position's logits (batch, vocab) (jax: and the updated cache)."""


class StatefulTrainingArch(Protocol):
    """jax, a model with state that training updates without a gradient (ResNet's batch norm): replaces
    :class:`TrainingArch`'s ``training_logits``."""

    def training_variables(self, model: Any) -> tuple[Any, Any]:
        """(parameters an optimizer trains, non-trained state) as pytrees."""

    def training_logits_and_stats(self, model: Any, params: Any, stats: Any, *inputs: Any) -> tuple[Any, Any]:
        """(training logits, updated state)."""


class EvaluatedArch(Protocol):
    """jax and tensorflow, phase fit: the logits in inference form after training."""

    def inference_logits(self, model: Any, *args: Any) -> Any:
        """(batch, classes) logits; jax: ``(model, params, stats, *inputs)``, tensorflow: ``(model, *inputs)``."""


class KerasTrainingArch(Protocol):
    """keras (phases training and fit): the model ``train_on_batch`` and ``fit`` train."""

    def training_model(self, model: Any, description: Any) -> Any:
        """A keras.Model sharing ``model``'s layers and variables whose one output is the training logits."""


class KerasCheckpointArch(Protocol):
    """keras (``fwbench diff``): the model's checkpoints (fwbench.models.checkpoints) as outputs of a sub-model."""

    def checkpoint_model(self, model: Any, description: Any) -> Any:
        """A keras.Model sharing ``model``'s layers and variables whose outputs are the model's outputs and every
        checkpoint of ``description.checkpoint_names()``, by name (each the output of a layer of the graph)."""


class WeightsModule(Protocol):
    """``<package>/weights.py``: reading a built model's variables back."""

    def parameter_arrays(self, model: Any) -> list[np.ndarray]:
        """Every floating variable of ``model`` as a float32 numpy copy, in the framework's own layout and in
        a fixed order."""


class FitModule(Protocol):
    """``<package>/fit.py``: phase fit."""

    def fit(self, backend: Any, dataset: Any, epochs: int, batch_size: int, epoch_end: EpochEnd = ...) -> Any:
        """Train ``backend``'s built model ``epochs`` epochs over ``dataset`` (fwbench.models.fit.FitDataset)
        with the framework's loop, calling ``epoch_end`` (fwbench.models.fit.EpochEnd) after each epoch's clock
        stops; a fwbench.models.fit.FitResult."""


class OnnxExporter(Protocol):
    """``<package>/deploy.py`` of a framework whose models a deployment engine runs from ONNX (torch,
    tensorflow)."""

    def configure(self, threads: int) -> None:
        """Give the exporting framework the cell's thread budget and full float32 precision."""

    def to_onnx(self, model: Any, inputs: Sequence[np.ndarray], path: str) -> dict[str, Any]:
        """Write ``model`` (built by the package's arch module) called on arrays shaped like ``inputs`` to the
        ONNX file ``path``, weights inside; return how (``exporter``)."""

    def versions(self) -> dict[str, str]:
        """Versions of the framework and of its exporter."""


class OnnxDecoderExporter(Protocol):
    """torch's ``deploy.py``, phase generate in the ONNX engines: a causal decoder's prefill and decode call as one
    pure graph (the cache in, the cache out)."""

    def decoder_to_onnx(self, arch: ModuleType, model: Any, path: str) -> dict[str, Any]:
        """The ONNX file ``path`` (weights inside) whose call (input_ids (batch, S) int32, start 0-d int64, past.0.key,
        past.0.value, ...) returns (the greedy token (batch,) int64, the last position's logits (batch, vocab), each
        cache tensor with positions start .. start + S - 1 written), the batch, S and cache-length axes free;
        return how."""

    def decoder_cache(self, arch: ModuleType, model: Any, batch: int, max_len: int) -> list[np.ndarray]:
        """The zero cache the step takes, flat (keys_0, values_0, keys_1, ...), as float32 numpy arrays."""

    def genai_to_onnx(self, arch: ModuleType, model: Any, path: str) -> dict[str, Any]:
        """The decoder in ONNX Runtime GenAI's contract (input_ids, attention_mask, past_key_values.N.key/value →
        logits (batch, 1, vocab + 1), present.N.key/value; every batch, length and cache axis free) written to
        ``path``, weights inside; return how."""

    def stateful_genai_to_onnx(self, arch: ModuleType, model: Any, path: str) -> dict[str, Any]:
        """The decoder in OpenVINO GenAI's contract before it is made stateful (the same names as
        :meth:`genai_to_onnx`, the past holding the positions so far and the present them and this call's: the
        cache grows), every batch and length axis free, written to ``path``, weights inside; return how."""

    def versions(self) -> dict[str, str]:
        """As :meth:`OnnxExporter.versions`."""


class TfliteExporter(Protocol):
    """``<package>/deploy.py`` of a framework whose models LiteRT runs (tensorflow)."""

    def configure(self, threads: int) -> None:
        """As :meth:`OnnxExporter.configure`."""

    def to_tflite(self, model: Any, inputs: Sequence[np.ndarray], path: str, quantize: bool = False) -> dict[str, Any]:
        """Write ``model`` called on arrays shaped like ``inputs`` to the TFLite file ``path`` with a signature
        ``serving_default`` (inputs ``input_0``.., outputs ``output_0``.. in the model's order); ``quantize``:
        dynamic-range int8 quantisation; return how."""

    def versions(self) -> dict[str, str]:
        """As :meth:`OnnxExporter.versions`."""


class ProfilerModule(Protocol):
    """``<package>/profile.py`` of a framework with a profiler (``fwbench profile``)."""

    def record(self, step: Callable[[], object], calls: int, directory: Path, device: str) -> dict[str, Any]:
        """``calls`` calls of ``step`` under the framework's profiler, its raw trace written under ``directory``.
        Returns ``trace`` (a Chrome-trace JSON file, plain or gzipped, that fwbench.profile.trace reads), ``rule``
        (which events of it are ops: a key of fwbench.profile.trace.OP_RULES), ``wall_s`` (the profiled calls'
        seconds in all, on the worker's clock) and ``profiler`` (name and version)."""


class LoaderModule(Protocol):
    """A loader runtime's ``data.py`` (phase data: the same names in torch/, tensorflow/ and grain/)."""

    LAYOUT: str  # the batches' image layout, NCHW or NHWC
    PACKED: str | None  # the dataset folder's subfolder --data-source packed reads; None: the image files

    def configure_threads(self, threads: int) -> int: ...

    def batches(self, source: Any, batch_size: int, packed: bool) -> Generator[Any, None, None]: ...

    def versions(self) -> dict[str, str]: ...


class PackingLoaderModule(Protocol):
    """A loader's ``data.py`` that also writes its packed format (``fwbench data make``)."""

    PACKED_ARGUMENT: str  # the manifest argument holding the number of packed files

    def write_packed(self, folder: Path, labels: list[tuple[str, int]], shards: int) -> list[Path]: ...


class ModelFileError(TypeError):
    """A model file lacks something its role requires."""


def role_members(role: type) -> tuple[str, ...]:
    """The attributes and functions a role (a Protocol above) requires."""
    names = [name for name in vars(role) if not name.startswith("_")]
    names += [name for name in getattr(role, "__annotations__", {}) if name not in names]
    return tuple(names)


def provides(module: ModuleType, role: type) -> bool:
    """Whether ``module`` has everything ``role`` requires."""
    return all(hasattr(module, name) for name in role_members(role))


def require(module: ModuleType, role: type) -> None:
    """ModelFileError naming the module, the role and every missing attribute unless ``module`` provides
    ``role``."""
    missing = [name for name in role_members(role) if not hasattr(module, name)]
    if missing:
        summary = (role.__doc__ or "").strip().splitlines()[0]
        raise ModelFileError(f"{module.__name__} does not provide {', '.join(missing)} ({role.__name__}: {summary})")


def as_arch(module: ModuleType) -> ArchModule:
    require(module, ArchModule)
    return cast(ArchModule, module)


def as_training_arch(module: ModuleType) -> TrainingArch:
    require(module, TrainingArch)
    return cast(TrainingArch, module)


def as_cached_decoder_arch(module: ModuleType) -> CachedDecoderArch:
    require(module, CachedDecoderArch)
    return cast(CachedDecoderArch, module)


def as_stateful_training_arch(module: ModuleType) -> StatefulTrainingArch | None:
    """The stateful training role where ``module`` provides it, else None."""
    return cast(StatefulTrainingArch, module) if provides(module, StatefulTrainingArch) else None


def as_evaluated_arch(module: ModuleType) -> EvaluatedArch:
    require(module, EvaluatedArch)
    return cast(EvaluatedArch, module)


def as_keras_checkpoint_arch(module: ModuleType) -> KerasCheckpointArch:
    require(module, KerasCheckpointArch)
    return cast(KerasCheckpointArch, module)


def as_keras_training_arch(module: ModuleType) -> KerasTrainingArch:
    require(module, KerasTrainingArch)
    return cast(KerasTrainingArch, module)


def layout_of(module: ModuleType) -> str | None:
    """The layout an arch module says it computes in (:class:`LaidOutArch`), None where it says none."""
    return cast(LaidOutArch, module).LAYOUT if provides(module, LaidOutArch) else None


def as_weights(module: ModuleType) -> WeightsModule:
    require(module, WeightsModule)
    return cast(WeightsModule, module)


def as_fit(module: ModuleType) -> FitModule:
    require(module, FitModule)
    return cast(FitModule, module)


def as_loader(module: ModuleType) -> LoaderModule:
    require(module, LoaderModule)
    return cast(LoaderModule, module)


def as_packing_loader(module: ModuleType) -> PackingLoaderModule:
    require(module, PackingLoaderModule)
    return cast(PackingLoaderModule, module)


# -- where the model files are ------------------------------------------------------------------------
def builtin_package(framework: str) -> str:
    """The package of a built-in framework's model files: ``fwbench.frameworks.<framework>``."""
    return f"{BUILTIN_PACKAGE}.{framework}"


def arch_module_name(package: str, arch: str) -> str:
    """The module implementing ``arch`` for the framework package ``package``: the module a registered model
    names for it (``ModelDescription.implementations``), else ``<package>.<arch>``. Nothing is imported
    but the model registry."""
    return implementations(arch).get(package, f"{package}.{arch}")


def import_arch(package: str, arch: str) -> ArchModule:
    """The checked model file of ``arch`` for ``package`` (imports it, and so its framework)."""
    return as_arch(importlib.import_module(arch_module_name(package, arch)))


def import_weights(package: str) -> WeightsModule:
    """The checked ``<package>.weights``."""
    return as_weights(importlib.import_module(f"{package}.weights"))


def import_fit(package: str) -> FitModule:
    """The checked ``<package>.fit`` (phase fit)."""
    return as_fit(importlib.import_module(f"{package}.fit"))


def import_deploy(package: str) -> ModuleType:
    """``<package>.deploy``, unchecked: each deployment backend checks the role it uses (:func:`as_onnx_exporter`,
    :func:`as_tflite_exporter`)."""
    return importlib.import_module(f"{package}.deploy")


def import_profiler(package: str) -> ProfilerModule:
    """The checked ``<package>.profile`` (``fwbench profile``)."""
    module = importlib.import_module(f"{package}.profile")
    require(module, ProfilerModule)
    return cast(ProfilerModule, module)


def as_onnx_exporter(module: ModuleType) -> OnnxExporter:
    require(module, OnnxExporter)
    return cast(OnnxExporter, module)


def as_onnx_decoder_exporter(module: ModuleType) -> OnnxDecoderExporter | None:
    """The decoder-export role where ``module`` provides it, else None."""
    return cast(OnnxDecoderExporter, module) if provides(module, OnnxDecoderExporter) else None


def as_tflite_exporter(module: ModuleType) -> TfliteExporter:
    require(module, TfliteExporter)
    return cast(TfliteExporter, module)

"""The backend interface every framework implements (:class:`Backend`), the refusals it raises, and the export
report of the deployment engines. No framework is imported here.

One backend instance runs one cell in one worker process:
``configure_threads → configure_precision → build → make_inputs → compile → make_step / infer / sync``
(phase training: ``… → make_inputs → make_targets → make_train_step``). What the framework's model files provide
and where they are: :mod:`fwbench.frameworks.roles`.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar, Protocol

import numpy as np

from fwbench.frameworks.kernel_reports import not_reported_entry
from fwbench.frameworks.roles import (
    ArchModule,
    FitModule,
    arch_module_name,
    as_arch,
    builtin_package,
    import_fit,
    import_profiler,
    import_weights,
    layout_of,
    require,
)
from fwbench.messages import NO_PROFILER
from fwbench.models.base import ModelDescription
from fwbench.spec import Settings

EXPORT_CACHE_ENV = "FWBENCH_EXPORT_CACHE"  # the manager's export cache of one comparison group (a folder)
# the manager's cache of the artefacts exported with every axis free (one per model: phase generate's decoder step),
# shared by every group of a run (a folder)
MODEL_EXPORT_CACHE_ENV = "FWBENCH_MODEL_EXPORTS"


def export_report(exports: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A ``compile_report`` from a backend's exports in order (one per input shape): the first, made for the timed
    shapes, with the later ones (the parity shape's) under ``reexports``; empty before any export."""
    if not exports:
        return {}
    first, *later = exports
    return {**first, "reexports": later} if later else dict(first)


class Decoder(Protocol):
    """Phase generate's program of one backend (:meth:`Backend.make_decoder`): its cache lives inside it. A token is
    the framework's (batch,) integer tensor, logits its (batch, vocab) float tensor; neither is synchronised."""

    def prefill(self, prompt: Any) -> tuple[Any, Any]:
        """The prompt (batch, prompt_len) from :meth:`Backend.make_inputs` at positions 0 .. prompt_len - 1 into the
        cache → (the greedy next token, the last position's logits)."""
        ...

    def decode(self, token: Any, position: int) -> tuple[Any, Any]:
        """``token`` (batch,) at ``position`` into the cache → (the greedy next token, its logits)."""
        ...

    def decode_loop(self, token: Any, position: int, steps: int) -> Any | None:
        """``steps`` decode steps from ``token`` at ``position`` as one compiled loop → the tokens (batch, steps);
        None where the runtime has no such loop."""
        ...

    def numpy(self, value: Any) -> np.ndarray:
        """A token, tokens or logits tensor as a numpy array (outside any timed call)."""
        ...


@dataclass
class WholeGeneration:
    """One generation by a runtime whose loop runs it in one call (:class:`WholeGenerationDecoder`): its ``tokens``
    (batch, new_tokens) and the seconds its own clock measured: ``prefill_s`` (to the first token) and ``decode_s``
    (each further token's, new_tokens - 1)."""

    tokens: np.ndarray
    prefill_s: float
    decode_s: list[float]


class WholeGenerationDecoder(Protocol):
    """Phase generate's program of a vendor loop that generates a whole sequence per call and times its own steps
    (OpenVINO GenAI's ``LLMPipeline``); it gives no logits, so its tokens are checked without them."""

    def generate_whole(self, prompt: Any, new_tokens: int) -> WholeGeneration:
        """``new_tokens`` greedy tokens after ``prompt`` (batch, prompt_len), each step timed by the loop itself."""
        ...


class UnsupportedMode(ValueError):
    """The backend has no such mode."""


class UnsupportedDtype(ValueError):
    """The backend cannot compute in that dtype."""


class Backend(ABC):
    """One framework in one execution mode, on one device."""

    framework: ClassVar[str]
    modes: ClassVar[tuple[str, ...]]
    # Its outputs are its inputs (phase serving's floor, fwbench.frameworks.floor.backend): parity is checked against them.
    echoes_inputs: ClassVar[bool] = False

    def __init__(
        self, mode: str, device: str, settings: Settings, *, dtype: str = "fp32", phase: str = "inference"
    ) -> None:
        """The runtime's record decides the dtypes it computes in (``RuntimeInfo.dtypes``, checked by
        ``frameworks.create_backend`` before this is called)."""
        if mode not in self.modes:
            raise UnsupportedMode(f"{self.framework} has no mode {mode!r}; allowed: {', '.join(self.modes)}")
        self.mode = mode
        self.device = device
        self.settings = settings
        self.dtype = dtype  # the case's dtype: "fp32", or "bf16": the mixed-precision policy of fwbench.precision
        # The case's phase (spec.Phase), given at creation (a backend builds and compiles for its phase).
        self.phase = phase
        # Where this framework's model files are (frameworks.create_backend sets a plugin runtime's package).
        self.package = builtin_package(self.framework)
        self.description: ModelDescription | None = None
        self.model: Any = None
        self.layout: str | None = None

    # -- set-up -------------------------------------------------------------------------------
    @abstractmethod
    def configure_threads(self, intra_op: int, inter_op: int) -> dict[str, Any]:
        """Apply the thread budget through the framework's own API; return what it now reports."""

    @abstractmethod
    def configure_precision(self) -> dict[str, object]:
        """Make float32 matmuls/convolutions compute in full float32 (no TF32 or bf16 passes);
        return the framework's own report of the setting now in force. With ``dtype`` bf16 the
        report also has ``bf16_mechanism``: how this framework computes in bfloat16."""

    def arch_module(self, description: ModelDescription | None = None) -> ModuleType:
        """This framework's model file for ``description``'s architecture (default: the built model's),
        checked to provide :class:`ArchModule` (:func:`arch_module_name` says where it is). Each caller
        checks the further role it uses (``as_training_arch`` and the like)."""
        description = self.description if description is None else description
        assert description is not None, "build() first"
        module = importlib.import_module(arch_module_name(self.package, description.arch))
        require(module, ArchModule)
        return module

    def build(self, description: ModelDescription, weights: dict[str, np.ndarray]) -> None:
        """Build ``description`` with the canonical ``weights`` from this framework's arch module."""
        description.check_weights(weights)
        module = self.arch_module(description)
        self.description = description
        self.model = as_arch(module).build_model(description, weights, self.device)
        # Image models say which memory layout they compute in (the canonical inputs are NCHW).
        self.layout = layout_of(module)

    @abstractmethod
    def make_inputs(self, arrays: dict[str, np.ndarray]) -> tuple[Any, ...]:
        """Framework tensors on the device, in the description's input order (built once, untimed)."""

    @abstractmethod
    def compile(self, inputs: Sequence[Any]) -> None:
        """Prepare the mode's callable for these inputs (tracing happens at the first call)."""

    # -- the timed call -----------------------------------------------------------------------
    @abstractmethod
    def infer(self, inputs: Sequence[Any]) -> tuple[Any, ...]:
        """One inference call; outputs in ``description.output_names`` order (may be asynchronous)."""

    @abstractmethod
    def sync(self, outputs: Any) -> None:
        """Block until ``outputs`` are computed (device synchronisation)."""

    def make_step(self, inputs: Sequence[Any]) -> Callable[[], object]:
        """The zero-argument call the timers measure: one inference, synchronised."""
        infer, sync = self.infer, self.sync

        def step() -> object:
            outputs = infer(inputs)
            sync(outputs)
            return outputs

        return step

    # -- phase training: one optimizer step per timed call ---------------------------------------
    def make_targets(self, arrays: dict[str, np.ndarray]) -> tuple[Any, ...]:
        """Framework tensors of ``ModelDescription.make_targets`` (labels, label_weights), built once, untimed."""
        return self.make_inputs(arrays)

    def make_train_step(self, inputs: Sequence[Any], targets: Sequence[Any]) -> Callable[[], object]:
        """Prepare training (optimizer from ``settings.optimizer``, compiled step where the mode compiles)
        and return the zero-argument timed call: ONE optimizer step on this fixed batch (forward, loss,
        backward, parameter update), synchronised, returning the loss computed before that step's update
        (read it with :meth:`loss_value`). Tracing and compilation happen at the first call."""
        raise NotImplementedError(f"{self.framework}:{self.mode} has no training phase yet")

    # -- phase generate: greedy decoding with a key/value cache -------------------------------------
    def make_decoder(self, batch: int, prompt_len: int, new_tokens: int) -> Decoder:
        """The built causal decoder as phase generate runs it (after :meth:`build`): a key/value cache of
        ``prompt_len + new_tokens`` positions for ``batch`` rows, allocated here, and the mode's prefill and decode
        programs (compiled where the mode compiles: at their first call; exported and loaded here for the deployment
        engines). NotImplementedError where the runtime or the model has none."""
        raise NotImplementedError(f"{self.framework}:{self.mode} has no generate phase yet")

    # a vendor loop that generates a whole sequence per call (phase generate calls make_whole_decoder instead)
    whole_generations: ClassVar[bool] = False

    def make_whole_decoder(self, batch: int, prompt_len: int, new_tokens: int) -> WholeGenerationDecoder:
        """As :meth:`make_decoder`, for a runtime with ``whole_generations``."""
        raise NotImplementedError(f"{self.framework}:{self.mode} runs no whole generations")

    def allreduce_seconds(self, elements: int, repeats: int) -> list[float]:
        """A distributed runtime, after its timed steps: the seconds of ``repeats`` bare all-reduces (sum) of
        ``elements`` float32 values across the cell's processes (each started together after a barrier), through
        the collectives its training step uses: what communicating one step's gradients costs without the
        step."""
        raise NotImplementedError(f"{self.framework}:{self.mode} runs in one process")

    def barrier(self) -> None:
        """A distributed runtime, before each timed block: return once every process of the cell has reached it,
        so all start the block together (a rank that got the block command later, e.g. relayed from another
        machine, would otherwise make the others wait for it in their first all-reduce, inside their timers)."""
        raise NotImplementedError(f"{self.framework}:{self.mode} runs in one process")

    def loss_value(self, loss: object) -> float:
        """A loss the train step returned, as a Python float (outside the timed call)."""
        return float(loss)  # type: ignore[arg-type]

    def loss_after(self, step: Callable[[], object]) -> float:
        """The loss of one more step (on the parameters the earlier steps left), as a Python float."""
        return self.loss_value(step())

    def parameter_arrays(self) -> list[np.ndarray]:
        """The current (trained) values of the model's floating variables, float32, in the framework's
        layout and in ``<package>.weights.parameter_arrays`` order."""
        return import_weights(self.package).parameter_arrays(self.model)

    def model_arrays(self, model: Any) -> list[np.ndarray]:
        """The floating variables of a model ``build_model`` made, in :meth:`parameter_arrays` order."""
        return import_weights(self.package).parameter_arrays(model)

    def fit_module(self) -> FitModule:
        """This framework's checked ``fit.py`` (phase fit)."""
        return import_fit(self.package)

    def gradient_arrays(self, inputs: Sequence[Any], targets: Sequence[Any]) -> tuple[object, list[np.ndarray]]:
        """``fwbench diff --phase training``: (the loss, as a train step returns it; the gradient of every array
        :meth:`parameter_arrays` lists, in its order and layout, zeros where the loss has none), computed by this
        mode's training program from the built weights, before any update. NotImplementedError where the runtime
        does not hand its gradients out."""
        raise NotImplementedError(f"{self.framework}:{self.mode} does not hand out its gradients to fwbench")

    def gradients(self, inputs: Sequence[Any], targets: Sequence[Any]) -> tuple[float, dict[str, np.ndarray]]:
        """(loss, every canonical tensor's gradient by canonical name, canonical layout) of :meth:`gradient_arrays`."""
        loss, arrays = self.gradient_arrays(inputs, targets)
        return self.loss_value(loss), self.canonical_arrays(arrays)

    def trained_parameters(self) -> dict[str, np.ndarray]:
        """Every canonical tensor's current value (after the training steps taken so far) by canonical name,
        in the canonical layout and shape, float32 (:meth:`canonical_arrays` of :meth:`parameter_arrays`)."""
        return self.canonical_arrays(self.parameter_arrays())

    def canonical_arrays(self, values: list[np.ndarray]) -> dict[str, np.ndarray]:
        """``values``: arrays laid out as :meth:`parameter_arrays` lists the model's variables (their values, or gradients)
        mapped back to every canonical tensor by canonical name, in the canonical layout and shape, float32.

        The inverse of the weight map is read off the forward map itself: the model is built once more
        (float32, same arch module and map) from probe weights whose elements hold their own global index
        (digits in base 2**22, exact in float32; one build per digit), so every element of every framework
        variable names the canonical element it was set from, whatever transposes or fusions the map does.
        Variables whose probe values are not indices (not set from the canonical weights) are left out;
        ValueError if some canonical element is held by no variable."""
        assert self.description is not None, "build() first"
        schema = {spec.name: tuple(spec.shape) for spec in self.description.param_schema()}
        sizes = {name: int(np.prod(shape, dtype=np.int64)) for name, shape in schema.items()}
        ids = self._probe_ids(schema, sizes)
        if len(values) != len(ids):
            raise ValueError(f"{self.framework}: {len(values)} variables now, {len(ids)} in the probe model")
        return _canonical_from_ids(self.framework, ids, values, schema, sizes)

    def _probe_ids(self, schema: dict[str, tuple[int, ...]], sizes: dict[str, int]) -> list[np.ndarray | None]:
        """For every variable of the model (:meth:`model_arrays` order), the global canonical index each of its
        elements was set from, read off builds from probe weights (:meth:`canonical_arrays`); None for a variable
        not set from the canonical weights."""
        assert self.description is not None, "build() first"
        arch = as_arch(self.arch_module())
        total = sum(sizes.values())
        base, digits = 2**22, 1
        while base**digits < total:
            digits += 1
        ids: list[np.ndarray | None] = []
        for digit in range(digits):
            probe = _probe_weights(schema, sizes, base, digit)
            model = arch.build_model(self.description, probe, self.device)
            arrays = self.model_arrays(model)
            del model, probe
            if not ids:
                ids = [np.zeros(a.shape, dtype=np.int64) for a in arrays]
            _add_probe_digit(ids, arrays, base, digit)
        return ids

    # -- results and diagnostics --------------------------------------------------------------
    @abstractmethod
    def to_numpy(self, outputs: Sequence[Any]) -> dict[str, np.ndarray]:
        """Outputs by name as numpy arrays (for parity checks)."""

    def checkpoints(self, inputs: Sequence[Any]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """``fwbench diff`` and a parity mismatch's first divergence: one call at ``inputs`` (from
        :meth:`make_inputs`, after :meth:`compile` for their shapes) of this mode's program built with the model's
        checkpoints (``description.checkpoint_names()``, fwbench.models.checkpoints) as extra outputs: a compiled
        mode compiles that program itself (tf.function, XLA, jax.jit, torch.compile, TorchScript, AOTInductor), so a
        fault only the compiler makes shows where it appears. Returns (outputs as :meth:`to_numpy` gives them,
        checkpoints by name as float32 numpy in the canonical layout: image tensors NCHW, see
        :meth:`canonical_checkpoints`). The timed program is untouched. NotImplementedError where the runtime exposes
        the model's outputs only (an exported file)."""
        raise NotImplementedError(f"{self.framework}:{self.mode} exposes only the model's outputs (an exported file)")

    def canonical_checkpoints(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Captured checkpoints as float32 in the canonical layout: a model computing channels-last (``layout``
        NHWC, or "NHWC inside the call …") has its 4-D checkpoints transposed to NCHW, as the reference's are."""
        channels_last = (self.layout or "").startswith("NHWC")

        def canonical(array: np.ndarray) -> np.ndarray:
            array = np.asarray(array, dtype=np.float32)
            return array.transpose(0, 3, 1, 2) if channels_last and array.ndim == 4 else array

        return {name: canonical(array) for name, array in arrays.items()}

    def observe_precision(self, inputs: Sequence[Any]) -> dict[str, list[str]] | None:
        """What the built model's forward on ``inputs`` (from :meth:`make_inputs`) computes in, read from the
        framework itself (traced graph, jaxpr, an op trace under autocast): op class (fwbench.precision
        OBSERVED_OPS) → the sorted dtype names of its operands. None where this runtime cannot look inside
        (an exported engine)."""
        return None

    def profile(self, step: Callable[[], object], calls: int, directory: Path) -> dict[str, Any]:
        """``fwbench profile``: ``calls`` calls of ``step`` under this framework's own profiler, the raw trace
        kept under ``directory`` (:class:`ProfilerModule`). A runtime whose framework has no ``profile.py``
        raises NotImplementedError: the cell is stored as ``error`` with that reason."""
        try:
            profiler = import_profiler(self.package)
        except ModuleNotFoundError as exc:
            if exc.name != f"{self.package}.profile":
                raise
            raise NotImplementedError(f"{self.framework}:{self.mode} {NO_PROFILER}") from None
        return profiler.record(step, calls, directory, self.device)

    def kernel_libraries(self, step: Callable[[], object], inputs: Sequence[Any]) -> list[dict[str, Any]]:
        """``details.kernels``: the libraries that ran the heavy ops of ``step`` (the timed call, compiled for
        ``inputs``), each with its version, the ISA it reported and where that came from
        (:func:`fwbench.frameworks.kernel_reports.kernel_entry`), read from the libraries' own reports, never from
        the CPU's flags. Called once after the timed calls; may call ``step`` once more with verbose modes on
        (output captured, untimed). This default: one entry saying nothing is reported, and why."""
        return [not_reported_entry(f"{self.framework}:{self.mode} has no kernel-library probe in fwbench")]

    def compile_counters(self) -> dict[str, int]:
        """Cumulative compile-health counters of this process, read from the framework (cheap; never
        called inside the timed window). Keys, each where the framework can tell: ``traces`` (traces
        or retraces of the timed callable), ``compiles`` (graphs or programs compiled),
        ``graph_breaks`` and ``eager_fallbacks`` (torch.compile frames left to eager). Any of them
        growing while the timed loop runs means the loop recompiled. Empty for a mode that compiles
        nothing at run time."""
        return {}

    def save_artefact(self, inputs: Sequence[Any], path: str) -> dict[str, Any]:
        """``fwbench export``: write the artefact this runtime runs, for ``inputs``' shapes, to ``path`` (a file, or
        a folder for a SavedModel), load it back from there so that :meth:`infer` runs the written artefact, and
        return what it cost (a ``compile_report``). Only deployment runtimes write one."""
        raise NotImplementedError(f"{self.framework}:{self.mode} writes no artefact")

    def compile_report(self) -> dict[str, Any]:
        """What ``compile`` did ahead of the first call, as JSON-ready data the cell stores in its
        details (e.g. seconds per ahead-of-time step); empty for a mode with nothing to report."""
        return {}

    def reset_peak_memory(self) -> None:  # noqa: B027 (optional hook: most allocators keep no peak)
        """Reset the framework allocator's peak counter, where it has one."""

    def memory_stats(self) -> dict[str, int | None]:
        """The framework allocator's own figures, bytes (``allocator_peak_bytes`` where known)."""
        return {"allocator_peak_bytes": None}

    @abstractmethod
    def versions(self) -> dict[str, str]:
        """Versions of the framework and the libraries it runs on."""

    def is_oom(self, exc: BaseException) -> bool:
        """Whether ``exc`` is this framework's out-of-memory error."""
        return isinstance(exc, MemoryError)


def _probe_weights(
    schema: dict[str, tuple[int, ...]], sizes: dict[str, int], base: int, digit: int
) -> dict[str, np.ndarray]:
    """Probe weights of ``schema``: each element holds digit ``digit`` (base ``base``) of its global canonical index,
    plus 1 (never 0), float32 (exact below 2**24)."""
    offset, probe = 0, {}
    for name, shape in schema.items():
        index = np.arange(offset, offset + sizes[name], dtype=np.int64)
        probe[name] = ((index // base**digit) % base + 1).astype(np.float32).reshape(shape)
        offset += sizes[name]
    return probe


def _add_probe_digit(ids: list[np.ndarray | None], arrays: list[np.ndarray], base: int, digit: int) -> None:
    """Add digit ``digit`` read off a probe build's variables ``arrays`` to each variable's indices ``ids`` (in
    place); a variable whose values are no probe digits (not set from the canonical weights, e.g. a constant mask
    buffer) becomes None."""
    for i, array in enumerate(arrays):
        held = ids[i]
        if held is None:
            continue
        value = np.rint(array).astype(np.int64)
        if not (np.array_equal(value, array) and value.min(initial=1) >= 1 and value.max(initial=1) <= base) or (
            digit == 0 and array.size > 1 and value.min() == value.max()
        ):
            ids[i] = None
            continue
        held += (value - 1) * base**digit


def _canonical_from_ids(
    framework: str,
    ids: list[np.ndarray | None],
    values: list[np.ndarray],
    schema: dict[str, tuple[int, ...]],
    sizes: dict[str, int],
) -> dict[str, np.ndarray]:
    """Every canonical tensor by name, float32, its elements taken from ``values`` (the variables) where ``ids``
    say each came from; ValueError if some canonical element is held by no variable."""
    total = sum(sizes.values())
    flat = np.zeros(total, dtype=np.float32)
    covered = np.zeros(total, dtype=bool)
    for held, array in zip(ids, values):
        if held is not None:
            flat[held.ravel()] = array.ravel()
            covered[held.ravel()] = True
    result, offset = {}, 0
    for name, shape in schema.items():
        if not covered[offset : offset + sizes[name]].all():
            raise ValueError(f"{framework}: canonical tensor {name} is not (fully) held by any variable")
        result[name] = flat[offset : offset + sizes[name]].reshape(shape).copy()
        offset += sizes[name]
    return result

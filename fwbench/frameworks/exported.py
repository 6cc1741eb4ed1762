"""What the deployment engines share (``onnxruntime:*``, ``openvino:torch``, ``litert:tensorflow``): our model,
built from the exporting framework's model files (the mode names that framework) with the canonical weights,
exported by that framework's ``deploy.py`` to a file for the cell's input shapes, which the engine loads and
runs on numpy arrays. A shape not exported yet (the parity shape) is exported again; every export is in
``compile_report`` (export seconds, load seconds: the engine reading and preparing the file, file size, what
exported it, what the engine reports it compiled). The file lives in a temporary folder only while it loads, or,
in a sweep, in the manager's export cache of the comparison group (its rounds' fresh workers, and the engines that
run one exporter's file, load it instead of exporting again: ``cached: true`` with the export's own seconds).

Phase generate (:meth:`ExportedBackend.make_decoder`, where the exporter has the decoder role: torch): the decoder's
cached call as a pure step, the cache an input and the written cache an output, exported once per model with its
batch, token and cache axes free (one file serves the prefill, every decode step and every cell's shape: the export
cache keeps it for the run), loaded into the engine; :class:`ExportedDecoder` feeds each call's output cache to the
next call, as an ONNX decoder with past keys/values is run.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
import time
from abc import abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

import numpy as np

from fwbench import __version__
from fwbench.frameworks.base import EXPORT_CACHE_ENV, MODEL_EXPORT_CACHE_ENV, Backend, Decoder, export_report
from fwbench.frameworks.registry import get_runtime
from fwbench.frameworks.roles import OnnxDecoderExporter, as_onnx_decoder_exporter, builtin_package, import_deploy
from fwbench.messages import NO_PROFILER
from fwbench.spec import Settings

Signature = tuple[tuple[tuple[int, ...], str], ...]  # per input: (shape, numpy dtype name)
# What a cached artefact's record takes from the worker that exported it; the rest (shapes, size, what the engine
# reports when it loads) is this worker's own.
CACHED_FACTS = ("export_s", "exporter", "opset", "quantization", "quantized_ops", "int8_tensors")


def signature_of(inputs: Sequence[np.ndarray]) -> Signature:
    """What an export is specialised to: each input's shape and dtype."""
    return tuple((tuple(a.shape), str(a.dtype)) for a in inputs)


class ExportedBackend(Backend):
    """A deployment engine running an artefact exported per input shape. Subclasses say how to export
    (:meth:`export`), how to load (:meth:`load`) and call (:meth:`infer`) it, and the engine's thread settings."""

    suffix: ClassVar[str]  # the artefact's file extension, ".onnx"
    shares_export: ClassVar[bool] = False  # runs the exporter's raw fp32 file, which another engine may have made
    cuda_unavailable: ClassVar[str]  # why the engine does not run on CUDA here

    def __init__(
        self, mode: str, device: str, settings: Settings, *, dtype: str = "fp32", phase: str = "inference"
    ) -> None:
        super().__init__(mode, device, settings, dtype=dtype, phase=phase)
        if device != "cpu":
            raise NotImplementedError(f"{self.framework}:{mode} on {device}: {self.cuda_unavailable}")
        self.threads = 1
        self._signature: Signature | None = None
        self._exports: list[dict[str, Any]] = []
        self._exports_decoder = False  # phase generate: the exporter's decoder step is exported, not the model

    @functools.cached_property
    def deploy(self) -> ModuleType:
        """The exporting framework's ``deploy.py``, from the runtime record's package (``RuntimeInfo.package``, set
        by ``frameworks.create_backend``), imported on first use (after creation, before build). A record that names
        no package (an engine's own package is no exporter's) falls back to the built-in framework its mode names
        (``onnxruntime:torch`` → torch), as runtimes were found before records carried their exporter."""
        own = builtin_package(self.framework)
        return import_deploy(builtin_package(self.mode) if self.package == own else self.package)

    @functools.cached_property
    def decoder_exporter(self) -> OnnxDecoderExporter:
        """The exporting framework's decoder role (phase generate's vendor loops export through it); NotImplementedError
        where its ``deploy.py`` has none."""
        exporter = as_onnx_decoder_exporter(self.deploy)
        if exporter is None:
            raise NotImplementedError(f"{self.package} cannot export a decoder for {self.framework}")
        return exporter

    # -- what each engine provides ---------------------------------------------------------------
    @abstractmethod
    def export(self, inputs: Sequence[np.ndarray], path: str) -> dict[str, Any]:
        """Write the built model for ``inputs``' shapes to ``path``; return how (``exporter`` and the like)."""

    @abstractmethod
    def load(self, path: str, inputs: Sequence[np.ndarray]) -> dict[str, Any]:
        """Load ``path`` into the engine so that :meth:`infer` runs it; return what the engine reports it
        compiled (precision, providers, opset, ...)."""

    @abstractmethod
    def release(self) -> None:
        """Drop the loaded artefact (before the next shape's is loaded)."""

    def loaded_call(self) -> Callable[[Sequence[np.ndarray]], Sequence[np.ndarray]]:
        """The loaded artefact as a call on numpy inputs → its numpy outputs (phase generate's decoder holds it); an
        engine without it has no generate phase."""
        raise NotImplementedError(f"{self.framework}:{self.mode} has no generate phase (no loaded_call)")

    @abstractmethod
    def engine_threads(self) -> dict[str, Any]:
        """The engine's thread settings for :attr:`threads`, as the engine reports them."""

    # -- the Backend interface ---------------------------------------------------------------------
    def profile(self, step: Callable[[], object], calls: int, directory: Path) -> dict[str, Any]:
        """The engine has no profiler in fwbench (its package is the exporting framework's, whose profiler would
        see the engine's calls as no ops at all): the cell is stored as ``error`` with this reason."""
        raise NotImplementedError(f"{self.framework}:{self.mode} {NO_PROFILER}")

    def configure_threads(self, intra_op: int, inter_op: int) -> dict[str, Any]:
        """The engine gets the budget as its one pool (its own inter-op parallelism off); the exporting
        framework gets the same budget."""
        self.threads = intra_op
        self.deploy.configure(intra_op)
        return self.engine_threads()

    def make_inputs(self, arrays: dict[str, np.ndarray]) -> tuple[np.ndarray, ...]:
        return tuple(np.ascontiguousarray(a) for a in arrays.values())

    def cache_kind(self) -> str:
        """What the artefact is, for the export cache: the exporter's raw file (``shares_export``: fp32 engines that
        run one exporter's same file share it), else this engine's own (its quantised file)."""
        kind = f"{self.suffix}:{self.mode}:{self.dtype}" + (":decoder-step" if self._exports_decoder else "")
        return kind if self.shares_export and self.dtype == "fp32" else f"{kind}:{self.framework}"

    def axes_free(self) -> bool:
        """Whether the artefact has every axis free, so one export serves every cell of the model (phase generate's
        decoder step)."""
        return self._exports_decoder

    def compile_model_wide(self) -> None:
        """Phase generate's vendor loops: their one export per model (every axis free) exported, or taken from the
        run's cache, and loaded, keyed by the sizes the exporter's GenAI step is traced at (input_ids (2, 3),
        attention_mask (2, 8)), the same for every cell of the model."""
        self.compile([np.zeros((2, 3), np.int64), np.ones((2, 8), np.int64)])

    def cache_key(self, inputs: Sequence[np.ndarray]) -> str:
        """The export cache's name for this artefact: what it is, the model, its input signature, the weights
        (seed, or the file with its size and time) and the exporter's versions."""
        assert self.description is not None
        weights: object = self.settings.seed
        if self.settings.weights_path:
            stat = os.stat(self.settings.weights_path)
            weights = [os.path.abspath(self.settings.weights_path), stat.st_size, stat.st_mtime_ns]
        identity = {
            "kind": self.cache_kind(),
            "model": self.description.name,
            "signature": signature_of(inputs),
            "weights": weights,
            "versions": self.deploy.versions(),
            "fwbench": __version__,
        }
        return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:24]

    def compile(self, inputs: Sequence[Any]) -> None:
        """Export and load for these shapes, unless the loaded artefact is already for them. With an export cache
        (``FWBENCH_EXPORT_CACHE``, a folder the manager keeps for one comparison group), an artefact another worker
        exported for the same model, shape and weights is loaded instead of exported again; an export with every
        axis free (phase generate's decoder step) is looked up in the run's cache of those (``FWBENCH_MODEL_EXPORTS``),
        so one export serves every group of the model."""
        if signature_of(inputs) == self._signature:
            return
        # an export with its axes free serves every group of the model: the run's cache, else the group's
        cache = (self.axes_free() and os.environ.get(MODEL_EXPORT_CACHE_ENV)) or os.environ.get(EXPORT_CACHE_ENV)
        if cache and self._load_cached(inputs, Path(cache)):
            return
        with tempfile.TemporaryDirectory(prefix=f"fwbench-{self.framework}-") as folder:
            self._export_and_load(inputs, os.path.join(folder, f"model{self.suffix}"))

    def _load_cached(self, inputs: Sequence[np.ndarray], cache: Path) -> bool:
        """Load the cached artefact for ``inputs`` (with the facts of its export and ``cached: true``), or export it
        into the cache (artefact and facts each written under a temporary name, then renamed: a reader never sees
        half of either); False (nothing loaded) when a cached entry cannot be read or loaded: the caller exports
        afresh, so a broken entry costs time, never a cell."""
        key = self.cache_key(inputs)
        path, facts_path = cache / f"{key}{self.suffix}", cache / f"{key}.json"
        if path.exists() and facts_path.exists():
            try:
                facts = json.loads(facts_path.read_text())
                self._export_and_load(inputs, str(path), {k: facts[k] for k in CACHED_FACTS if k in facts})
            except (OSError, ValueError, RuntimeError):
                self.release()
                return False
            return True
        partial, partial_facts = cache / f".{key}.{os.getpid()}{self.suffix}", cache / f".{key}.{os.getpid()}.json"
        self._export_and_load(inputs, str(partial))
        made = self._exports[-1]
        partial_facts.write_text(json.dumps({k: made[k] for k in CACHED_FACTS if k in made}, sort_keys=True))
        os.replace(partial_facts, facts_path)
        os.replace(partial, path)  # last: an artefact in place always has its facts
        return True

    def save_artefact(self, inputs: Sequence[Any], path: str) -> dict[str, Any]:
        """The artefact written to ``path`` and loaded back from there."""
        self._export_and_load(inputs, path)
        return self._exports[-1]

    def _export_and_load(self, inputs: Sequence[np.ndarray], path: str, cached: dict[str, Any] | None = None) -> None:
        """Export for ``inputs``' shapes to ``path`` (``cached``: it is there already, exported as those facts say),
        load it, and record what each took."""
        self.release()
        self._signature = None
        started = time.perf_counter()
        how = (
            {}
            if cached is not None
            else self.export_decoder(path)
            if self._exports_decoder
            else self.export(inputs, path)
        )
        exported_at = time.perf_counter()
        size = os.path.getsize(path)
        facts = self.load(path, inputs)
        self._signature = signature_of(inputs)
        record = {
            "input_shapes": [list(a.shape) for a in inputs],
            "export_s": exported_at - started,
            "artefact_bytes": size,
            "artefact": get_runtime(f"{self.framework}:{self.mode}").artefact,
            **how,
        }
        if cached is not None:  # how the artefact used was made, by another worker
            record.update(cached, cached=True)
        self._exports.append({**record, "load_s": time.perf_counter() - exported_at, **facts})

    def export_decoder(self, path: str) -> dict[str, Any]:
        """Phase generate: the exporter's decoder step (:class:`fwbench.frameworks.roles.OnnxDecoderExporter`) to
        ``path``, its axes free."""
        assert self.description is not None
        return self.decoder_exporter.decoder_to_onnx(self.arch_module(self.description), self.model, path)

    def make_decoder(self, batch: int, prompt_len: int, new_tokens: int) -> Decoder:
        """The decoder step exported (:meth:`export_decoder`) and loaded through :meth:`compile`, keyed in the export
        cache by the traced sizes (the same for every cell of the model); the zero cache of ``prompt_len +
        new_tokens`` positions allocated here. NotImplementedError where the exporter has no decoder role."""
        exporter = as_onnx_decoder_exporter(self.deploy)
        if exporter is None:
            return super().make_decoder(batch, prompt_len, new_tokens)
        assert self.description is not None, "build() first"
        arch = self.arch_module(self.description)
        self._exports_decoder = True
        traced = [np.zeros((2, 3), np.int32), np.array(0, np.int64), *exporter.decoder_cache(arch, self.model, 2, 12)]
        self.compile(traced)  # the traced sizes, the same for every cell of the model: the export cache's key
        return ExportedDecoder(
            self.loaded_call(), exporter.decoder_cache(arch, self.model, batch, prompt_len + new_tokens)
        )

    def sync(self, outputs: Any) -> None:
        """Nothing to wait for: the engines return computed numpy arrays."""

    def to_numpy(self, outputs: Sequence[Any]) -> dict[str, np.ndarray]:
        assert self.description is not None
        return {name: np.asarray(o, dtype=np.float32) for name, o in zip(self.description.output_names, outputs)}

    def compile_report(self) -> dict[str, Any]:
        """The export for the timed shapes; ``reexports`` lists those for other shapes made later (parity)."""
        return export_report(self._exports)


class ExportedDecoder:
    """Phase generate in a deployment engine: the loaded decoder step, each call given the previous call's output
    cache (numpy arrays, flat: keys_0, values_0, ...) and its position as a 0-d int64 array."""

    def __init__(self, run: Callable[[Sequence[np.ndarray]], Sequence[np.ndarray]], cache: list[np.ndarray]) -> None:
        self._run, self._cache = run, cache
        max_len = int(cache[0].shape[2])
        self._positions = [np.array(p, dtype=np.int64) for p in range(max_len)]  # made once, not per step

    def _call(self, ids: np.ndarray, position: int) -> tuple[np.ndarray, np.ndarray]:
        token, logits, *cache = self._run([ids, self._positions[position], *self._cache])
        self._cache = cache
        return token, logits

    def prefill(self, prompt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self._call(prompt, 0)

    def decode(self, token: np.ndarray, position: int) -> tuple[np.ndarray, np.ndarray]:
        return self._call(token.astype(np.int32)[:, None], position)

    def decode_loop(self, token: np.ndarray, position: int, steps: int) -> None:
        return None  # the engines run one exported call at a time

    def numpy(self, value: np.ndarray) -> np.ndarray:
        return np.asarray(value)

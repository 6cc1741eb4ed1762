"""Framework-free model descriptions: config, parameter schema, canonical weights, inputs, FLOPs.

Every framework builds its model from a :class:`ModelDescription` and the canonical weights it
generates, so all frameworks compute the same function with the same numbers.
"""

from __future__ import annotations

import math
import zlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import numpy as np


@dataclass(frozen=True)
class ParamSpec:
    """One tensor of the canonical weight set: its canonical name and shape (framework-neutral layout)."""

    name: str
    shape: tuple[int, ...]


def tensor_rng(seed: int, name: str) -> np.random.Generator:
    """A generator seeded by (seed, tensor name), so one tensor's values never depend on another's."""
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def normal_weights(schema: list[ParamSpec], seed: int, std: float = 0.02) -> dict[str, np.ndarray]:
    """Transformer-style seeded weights: N(0, std) everywhere, LayerNorm scales around 1.

    Biases and LayerNorm parameters are non-zero on purpose, so that a tensor mapped to the
    wrong place, or not at all, changes the outputs and fails parity.
    """
    weights: dict[str, np.ndarray] = {}
    for spec in schema:
        values = tensor_rng(seed, spec.name).normal(0.0, std, size=spec.shape)
        if is_layer_norm_scale(spec.name):
            values += 1.0
        weights[spec.name] = values.astype(np.float32)
    return weights


def is_layer_norm_scale(name: str) -> bool:
    lowered = name.lower()
    return name.endswith(".weight") and (
        "layernorm" in lowered or "layer_norm" in lowered or ".ln_" in lowered or lowered.startswith("ln_")
    )


def _some(names: list[str], shown: int = 5) -> str:
    """A list of names for an error line: the first few, then how many more."""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return f"{names[:shown]}{more}"


class ModelDescription(ABC):
    """A model as data: everything a framework needs to build it, and nothing framework-specific.

    Subclasses set ``name`` and ``arch`` (the file name each framework implements it in,
    e.g. ``fwbench/frameworks/torch/mlp.py``) and say whether inputs have a sequence axis.
    """

    name: str
    arch: ClassVar[str]
    has_sequence: ClassVar[bool] = False
    max_seq_len: int | None = None
    output_names: tuple[str, ...]
    # Phase fit (fwbench.models.fit): label by the teacher's logits minus each class's mean over the dataset
    fit_teacher_centred: ClassVar[bool] = False
    # Model files a plugin model brings along: framework package (e.g. "fwbench.frameworks.torch") -> the module
    # implementing this arch for it (fwbench.frameworks.roles.ArchModule); a package not named here is looked in
    # for ``<package>.<arch>``.
    implementations: ClassVar[dict[str, str]] = {}

    @abstractmethod
    def param_schema(self) -> list[ParamSpec]:
        """Names and shapes of every parameter, in a fixed order."""

    @abstractmethod
    def canonical_weights(self, seed: int = 0) -> dict[str, np.ndarray]:
        """The seeded canonical weight set: name -> float32 array with the schema's shape."""

    @abstractmethod
    def make_inputs(self, batch_size: int, seq_len: int | None, seed: int = 0) -> dict[str, np.ndarray]:
        """Seeded inputs for one call, by input name."""

    @abstractmethod
    def forward_flops(self, batch_size: int, seq_len: int | None) -> int:
        """Floating-point operations of one inference forward pass (a multiply-add counts 2) of ``batch_size``
        samples; each phase counts its calls from this and :meth:`training_forward_flops`."""

    def attention_flops(self, batch_size: int, seq_len: int | None) -> int:
        """The part of :meth:`forward_flops` in attention's two batched matmuls (scores and context: 4·S²·H per
        layer and sample); 0 for a model without attention."""
        return 0

    def training_forward_flops(self, batch_size: int, seq_len: int | None) -> int:
        """FLOPs of the forward pass phase training runs: the training graph up to its loss, whose own matmuls
        count (a language model's vocabulary projection); the same as :meth:`forward_flops` unless the model
        trains through other layers than it infers with."""
        return self.forward_flops(batch_size, seq_len)

    def reference_forward(
        self, weights: dict[str, np.ndarray], inputs: dict[str, np.ndarray]
    ) -> dict[str, np.ndarray] | None:
        """A float64 numpy forward pass used as the parity reference, or None where there is none."""
        return None

    def checkpoint_names(self) -> tuple[str, ...]:
        """The named intermediate outputs every framework's implementation exposes (fwbench.models.checkpoints),
        in forward order; empty for a model without any (its outputs are still compared)."""
        return ()

    def reference_checkpoints(
        self, weights: dict[str, np.ndarray], inputs: dict[str, np.ndarray]
    ) -> dict[str, np.ndarray] | None:
        """The float64 reference's value at every checkpoint (:meth:`checkpoint_names`), or None where there is
        none."""
        return None

    # -- phase training (see fwbench/models/training.py) ------------------------------------------
    def training_unsupported(self) -> str | None:
        """None when the model has a training phase (targets, a loss, its reference), else why not."""
        return f"{self.name} has no training phase yet"

    def fit_unsupported(self) -> str | None:
        """None when the model has a fit phase (fwbench.models.fit: a synthetic dataset of one input,
        class labels from a teacher of the same architecture), else why not."""
        return f"{self.name} has no fit phase yet"

    def make_targets(self, batch_size: int, seq_len: int | None, seed: int = 0) -> dict[str, np.ndarray]:
        """Seeded targets for the batch ``make_inputs`` gives: ``labels`` (int32) and ``label_weights``
        (float32, 1 where a position counts in the loss), each (batch,) or (batch, seq)."""
        raise NotImplementedError(self.training_unsupported() or f"{self.name}: no targets")

    def reference_loss(
        self, weights: dict[str, np.ndarray], inputs: dict[str, np.ndarray], targets: dict[str, np.ndarray]
    ) -> float | None:
        """The float64 training loss of ``weights`` on this batch (training.reference_loss), or None."""
        return None

    def frozen_in_training(self) -> tuple[str, ...]:
        """Canonical tensors the training loss does not depend on: never updated, never decayed."""
        return ()

    def running_statistics(self) -> tuple[str, ...]:
        """Canonical tensors that are state, not parameters (batch-norm running statistics): a training
        step updates them the framework's own way, with no gradient and no weight decay."""
        return ()

    def trained_tensor_count(self) -> int:
        """How many canonical tensors an optimizer updates: all but the frozen ones and the running statistics."""
        return len(self.param_schema()) - len(self.frozen_in_training()) - len(self.running_statistics())

    def trained_element_count(self) -> int:
        """Elements of the tensors an optimizer updates (the gradients one data-parallel step all-reduces)."""
        skipped = {*self.frozen_in_training(), *self.running_statistics()}
        return sum(math.prod(p.shape) for p in self.param_schema() if p.name not in skipped)

    def parameter_count(self) -> int:
        """Learnable parameters (buffers such as batch-norm running statistics excluded)."""
        running = set(self.running_statistics())
        return sum(math.prod(p.shape) for p in self.param_schema() if p.name not in running)

    def parity_shape(self) -> tuple[int, int | None]:
        """(batch, seq_len) of the small input on which outputs are checked against the reference."""
        return 2, (min(16, self.max_seq_len or 16) if self.has_sequence else None)

    def supports_seq_len(self, seq_len: int | None) -> str | None:
        """None when the model can run at ``seq_len``, else the reason it cannot."""
        if not self.has_sequence or seq_len is None:
            return None
        if self.max_seq_len is not None and seq_len > self.max_seq_len:
            return f"sequence length {seq_len} exceeds {self.name}'s maximum of {self.max_seq_len}"
        return None

    def check_weights(self, weights: dict[str, np.ndarray]) -> None:
        """Raise ValueError unless ``weights`` holds exactly the schema's tensors with its shapes."""
        schema = {p.name: p.shape for p in self.param_schema()}
        missing = sorted(set(schema) - set(weights))
        unused = sorted(set(weights) - set(schema))
        if missing or unused:
            raise ValueError(f"{self.name} weights: missing {_some(missing)}, unexpected {_some(unused)}")
        for name, shape in schema.items():
            if tuple(weights[name].shape) != shape:
                raise ValueError(f"{self.name} weight {name}: shape {weights[name].shape}, expected {shape}")

"""Create tf.Variables from canonical numpy weights, each taken through :class:`fwbench.models.weightmap.WeightTaker`
(exactly once, with its expected shape after a layout transform, none left over)."""

from __future__ import annotations

from typing import Protocol

import numpy as np
import tensorflow as tf

from fwbench.frameworks.tensorflow.training import variable_name
from fwbench.models.weightmap import Transform, WeightTaker, identity


class MakeVariable(Protocol):
    """canonical name, expected shape after the transform, transform[, trainable] -> a checked tf.Variable"""

    def __call__(
        self, name: str, expected_shape: tuple[int, ...], transform: Transform, trainable: bool = True
    ) -> tf.Variable: ...


class CanonicalVariables:
    """Hands out canonical tensors as tf.Variables, each exactly once, each with its expected shape."""

    def __init__(self, weights: dict[str, np.ndarray]) -> None:
        self.taker = WeightTaker(weights)

    def take(
        self, name: str, expected_shape: tuple[int, ...], transform: Transform = identity, trainable: bool = True
    ) -> tf.Variable:
        """A variable (named :func:`~fwbench.frameworks.tensorflow.training.variable_name`) holding
        ``transform(weights[name])``; ValueError if missing, taken twice or misshapen. ``trainable=False`` for state
        that training updates without a gradient (batch-norm running statistics)."""
        value = self.taker.take(name, expected_shape, transform)
        return tf.Variable(value, name=variable_name(name), trainable=trainable)

    def check_all_used(self) -> None:
        """Raise unless every canonical tensor was mapped onto a variable."""
        self.taker.check_all_used()


def gradient_arrays(model: tf.Module, variables: list[tf.Variable], gradients: list[tf.Tensor]) -> list[np.ndarray]:
    """The gradients of ``variables`` (a training step's, in that order) laid out as :func:`parameter_arrays` lists
    the model's variables, float32; zeros for a variable not among them (frozen, or a running statistic)."""
    by_variable = {v.ref(): g for v, g in zip(variables, gradients)}
    return [
        np.asarray(tf.cast(by_variable[v.ref()], tf.float32).numpy())
        if v.ref() in by_variable
        else np.zeros(v.shape, np.float32)
        for v in model.variables
        if v.dtype.is_floating
    ]


def parameter_arrays(model: tf.Module) -> list[np.ndarray]:
    """Every floating variable of ``model`` (``tf.Module.variables`` order) as float32 numpy copies."""
    return [np.asarray(tf.cast(v, tf.float32).numpy()) for v in model.variables if v.dtype.is_floating]

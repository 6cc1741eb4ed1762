"""Phase fit in JAX (``jax:jit``): the manual loop JAX users write, a Python ``for`` over numpy batch slices
of the in-memory dataset (no shuffle) calling one ``jax.jit`` step (``jax.value_and_grad`` of the mean
softmax cross-entropy, the optax update and ``optax.apply_updates``; parameters and optimizer state donated
and carried). fwbench.models.fit says what is trained. ResNet: the step also carries (and donates) the batch-norm
running statistics (``training_variables``, ``training_logits_and_stats``: BN on batch statistics, torch's
update rule); the final logits are in inference form (``inference_logits``: BN on the running statistics).
"""

from __future__ import annotations

import time
from typing import Any

import jax
import numpy as np
import optax

from fwbench.frameworks.base import Backend, as_evaluated_arch
from fwbench.frameworks.jax.training import make_optimizer, training_forward, training_trees
from fwbench.frameworks.jax.weights import jax_device
from fwbench.models.fit import EpochEnd, FitDataset, FitResult, no_pause
from fwbench.models.training import optimizer_spec


def fit(
    backend: Backend, dataset: FitDataset, epochs: int, batch_size: int, epoch_end: EpochEnd = no_pause
) -> FitResult:
    """``epochs`` epochs of ``dataset`` in batches of ``batch_size`` (see the module docstring)."""
    assert backend.description is not None
    if backend.mode != "jit":
        raise NotImplementedError(f"jax:{backend.mode} has no fit phase")
    arch = backend.arch_module()
    model = backend.model
    optimizer = make_optimizer(optimizer_spec(backend.settings.optimizer))
    forward = training_forward(arch, model)

    def loss_fn(params: Any, stats: Any, xs: tuple[jax.Array, ...], labels: jax.Array) -> tuple[jax.Array, Any]:
        logits, stats = forward(params, stats, *xs)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean(), stats

    def train_step(
        params: Any, state: Any, stats: Any, xs: tuple[jax.Array, ...], labels: jax.Array
    ) -> tuple[Any, Any, Any, jax.Array]:
        (loss, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, stats, xs, labels)
        updates, state = optimizer.update(grads, state, params)
        return optax.apply_updates(params, updates), state, stats, loss

    epoch_s: list[float] = []
    epoch_loss: list[float] = []
    started = time.perf_counter()
    step = jax.jit(train_step, donate_argnums=(0, 1, 2))
    params, stats = training_trees(arch, model)
    state = jax.device_put(optimizer.init(params), jax_device(backend.device))
    inputs, labels = list(dataset.inputs.values()), dataset.labels
    for _ in range(epochs):
        epoch_start = time.perf_counter()
        losses = []
        for start in range(0, dataset.size, batch_size):
            end = start + batch_size
            params, state, stats, loss = step(
                params, state, stats, tuple(a[start:end] for a in inputs), labels[start:end]
            )
            losses.append(loss)
        mean = float(np.mean(jax.device_get(losses)))  # waits for the epoch's last step
        jax.block_until_ready((params, stats))
        epoch_s.append(time.perf_counter() - epoch_start)
        epoch_loss.append(mean)
        epoch_end(epoch_s[-1])
    total_s = time.perf_counter() - started
    evaluated = as_evaluated_arch(arch)
    logits = jax.jit(lambda p, s, *xs: evaluated.inference_logits(model, p, s, *xs))(params, stats, *inputs)
    return FitResult("manual loop + jax.jit step", epoch_s, epoch_loss, np.asarray(logits, dtype=np.float32), total_s)

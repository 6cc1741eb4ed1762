"""Phase fit in JAX (``jax:jit``): the manual loop JAX users write, a Python ``for`` over numpy batch slices
of the in-memory dataset (no shuffle) calling one ``jax.jit`` step (``jax.value_and_grad`` of the mean
softmax cross-entropy, the optax update and ``optax.apply_updates``; parameters and optimizer state donated
and carried). fwbench.models.fit says what is trained. ResNet: the step also carries (and donates) the batch-norm
running statistics (``training_variables``, ``training_logits_and_stats``: BN on batch statistics, torch's
update rule); the final logits are in inference form (``inference_logits``: BN on the running statistics).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fwbench.datasets.images import LoaderInput
from fwbench.frameworks.base import Backend
from fwbench.frameworks.jax.training import make_optimizer, training_forward, training_trees
from fwbench.frameworks.jax.weights import jax_device
from fwbench.frameworks.roles import as_evaluated_arch
from fwbench.models.fit import EpochEnd, FitDataset, FitResult, WaitClock, no_pause
from fwbench.models.training import optimizer_spec


def _grain_epochs(source: LoaderInput, batch_size: int, epochs: int) -> Generator[Iterator[Any], None, None]:
    """Each epoch's batches (images NHWC, labels) of grain:dataloader over the dataset's JPEGs: one Grain
    DataLoader of ``epochs`` passes (its workers start once), cut into epochs of n // batch_size batches."""
    from fwbench.datasets import images
    from fwbench.frameworks.grain import data as grain_data  # imports Grain: only for a fit from images

    steps = len(images.read_labels(source.folder, source.exclude)) // batch_size
    batches = iter(
        grain_data.make_loader(
            source.folder, batch_size, source.workers, source.crop, source.transform, source.seed,
            epochs=epochs, exclude=source.exclude,
        )
    )  # fmt: skip
    for _ in range(epochs):
        yield ((images_nhwc, labels) for images_nhwc, labels, _ in (next(batches) for _ in range(steps)))


_Carry = tuple[Any, Any, Any]  # what the step carries and donates: parameters, optimizer state, running statistics
_Step = Callable[[Any, Any, Any, tuple[Any, ...], Any], tuple[Any, Any, Any, jax.Array]]


def _jitted_step(forward: Any, optimizer: optax.GradientTransformation, *, nhwc: bool) -> _Step:
    """The jitted train step on (params, state, stats, inputs, labels), the carried trees donated: the mean softmax
    cross-entropy's value and gradient, the optax update; ``nhwc``: the images come NHWC (Grain) and are transposed
    to the models' NCHW inside the step."""

    def loss_fn(params: Any, stats: Any, xs: tuple[jax.Array, ...], labels: jax.Array) -> tuple[jax.Array, Any]:
        logits, stats = forward(params, stats, *xs)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean(), stats

    def train_step(
        params: Any, state: Any, stats: Any, xs: tuple[jax.Array, ...], labels: jax.Array
    ) -> tuple[Any, Any, Any, jax.Array]:
        if nhwc:
            xs = (jnp.transpose(xs[0], (0, 3, 1, 2)),)  # Grain's NHWC → NCHW, what the models take
        (loss, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, stats, xs, labels)
        updates, state = optimizer.update(grads, state, params)
        return optax.apply_updates(params, updates), state, stats, loss

    return jax.jit(train_step, donate_argnums=(0, 1, 2))


def _epoch_in_memory(
    step: _Step, carry: _Carry, inputs: list[np.ndarray], labels: np.ndarray, size: int, batch_size: int
) -> tuple[_Carry, list[jax.Array]]:
    """One epoch over the in-memory dataset's numpy slices, in order; (the carried trees after it, each step's loss,
    not waited for)."""
    params, state, stats = carry
    losses = []
    for start in range(0, size, batch_size):
        end = start + batch_size
        params, state, stats, loss = step(params, state, stats, tuple(a[start:end] for a in inputs), labels[start:end])
        losses.append(loss)
    return (params, state, stats), losses


def _epoch_from_loader(
    step: _Step, carry: _Carry, clock: WaitClock, epochs_of_batches: Iterator[Iterator[Any]]
) -> tuple[_Carry, list[jax.Array]]:
    """One epoch of the loader's next pass, each step waited for before the next batch is fetched (the clock times
    the fetches); (the carried trees after it, each step's loss)."""
    params, state, stats = carry
    losses = []
    clock.start_epoch()
    for images_nhwc, batch_labels in clock.batches(next(epochs_of_batches)):
        params, state, stats, loss = step(params, state, stats, (images_nhwc,), batch_labels)
        losses.append(loss.block_until_ready())  # the step has ended before the next fetch is timed
    clock.end_epoch()
    return (params, state, stats), losses


def fit(
    backend: Backend,
    dataset: FitDataset,
    epochs: int,
    batch_size: int,
    epoch_end: EpochEnd = no_pause,
    loader: LoaderInput | None = None,
) -> FitResult:
    """``epochs`` epochs of ``dataset`` in batches of ``batch_size`` (see the module docstring). With ``loader``
    the epochs read the images through grain:dataloader instead (NHWC batches, transposed to the models' NCHW
    inside the jitted step), and the loop's waits for it are reported (``extra["input"]``); ``dataset`` is then
    the evaluation set. The loop then waits for each step's result before it fetches the next batch, so a fetch is
    time it stood idle, as in the torch and TensorFlow loops (measured without: the fetch overlapped the running
    step and counted 55% of an epoch as waiting, data suite, 2 cores)."""
    assert backend.description is not None
    if backend.mode != "jit":
        raise NotImplementedError(f"jax:{backend.mode} has no fit phase")
    arch = backend.arch_module()
    model = backend.model
    optimizer = make_optimizer(optimizer_spec(backend.settings.optimizer))
    forward = training_forward(arch, model)
    epoch_s: list[float] = []
    epoch_loss: list[float] = []
    started = time.perf_counter()
    step = _jitted_step(forward, optimizer, nhwc=loader is not None)
    params, stats = training_trees(arch, model)
    state = jax.device_put(optimizer.init(params), jax_device(backend.device))
    carry: _Carry = (params, state, stats)
    inputs, labels = list(dataset.inputs.values()), dataset.labels
    clock = WaitClock()
    epochs_of_batches = _grain_epochs(loader, batch_size, epochs) if loader is not None else None
    for _ in range(epochs):
        epoch_start = time.perf_counter()
        if epochs_of_batches is None:
            carry, losses = _epoch_in_memory(step, carry, inputs, labels, dataset.size, batch_size)
        else:
            carry, losses = _epoch_from_loader(step, carry, clock, epochs_of_batches)
        mean = float(np.mean(jax.device_get(losses)))  # waits for the epoch's last step
        jax.block_until_ready((carry[0], carry[2]))
        epoch_s.append(time.perf_counter() - epoch_start)
        epoch_loss.append(mean)
        epoch_end(epoch_s[-1])
    params, _, stats = carry
    total_s = time.perf_counter() - started
    if epochs_of_batches is not None:
        epochs_of_batches.close()  # Grain's loader and its worker processes go before the evaluation
    evaluated = as_evaluated_arch(arch)
    logits = jax.jit(lambda p, s, *xs: evaluated.inference_logits(model, p, s, *xs))(params, stats, *inputs)
    extra: dict[str, Any] = {}
    if loader is not None:
        extra["input"] = clock.report(epoch_s, "grain:dataloader", "NHWC")
    loop = "manual loop + jax.jit step" + (" over the dataset's JPEGs (Grain)" if loader is not None else "")
    return FitResult(loop, epoch_s, epoch_loss, np.asarray(logits, dtype=np.float32), total_s, extra)

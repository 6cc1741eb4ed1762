"""What phase ``fit`` trains on and reports, framework-free: a seeded synthetic classification dataset held
in memory, the result every framework's ``fit`` returns, and the final loss/accuracy and their agreement.

Dataset: ``n`` inputs from the model's own ``make_inputs(n, None, seed)`` (the MLP: x (n, 64) float32,
standard normal; resnet-tiny: pixel_values (n, 3, 64, 64) float32, standard normal) and class labels (n,)
int32 = argmax of the logits of a *teacher*: the same architecture with the canonical weights of seed
``seed + 1`` in float64, in inference form (learnable, fixed, no framework involved); where the description
says ``fit_teacher_centred`` (ResNet) each class's logit is first centred on its mean over the dataset.
The final loss/accuracy is of the whole dataset after the last epoch, in inference form (ResNet: batch norm
on the running statistics the epochs left; during the epochs it is in training form).
Every loop visits the samples in the same order every epoch (no shuffling), in batches of the cell's
batch size (the sample count must be a multiple of it), with the training loss of ``models.training``
(softmax cross-entropy, mean over the batch) and the optimizer of ``Settings.optimizer``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from fwbench.datasets import images, transforms
from fwbench.models.base import ModelDescription
from fwbench.models.training import reference_loss

# Final full-dataset loss of a loop vs torch:eager's manual loop after the same epochs: relative difference
# at most FIT_LOSS_RTOL, accuracy within FIT_ACCURACY_ATOL (absolute fraction). Same data, order, weights and
# optimizer numbers; what differs is float32 summation order and Keras' AdamW adding ε to √v rather than √v̂
# (the Keras optimizer is also what tensorflow:function uses), both amplified by training. Measured on the
# MLP, AdamW: 2 epochs × 512 samples, batch 64: ≤ 1.2e-6 relative, same accuracy; 5 epochs × 4096, batch 32
# (640 steps): torch:lightning 0, jax:jit and keras:torch 4.6e-5, the Keras-optimizer loops 5.5e-4,
# accuracy within 0.002. The tolerance is about 4x the largest of these.
FIT_LOSS_RTOL = 2e-3
FIT_ACCURACY_ATOL = 0.01
FIT_TOLERANCES: dict[str, tuple[float, float]] = {}  # per model (loss rtol, accuracy atol) where not the above
TEACHER_CHUNK = 256  # samples per float64 teacher forward (the teacher is in inference form: per-sample)


EpochEnd = Callable[[float], None]
"""Called by every framework's fit loop after each epoch, once that epoch's clock has stopped and before the next
one's starts, with the epoch's wall seconds. Interleaved (phase fit's worker) it waits there for the manager's
next command, so an epoch is one block; the wait is outside every epoch's time."""


def no_pause(seconds: float) -> None:
    """The default :data:`EpochEnd`: the next epoch starts at once."""


@dataclass(frozen=True)
class FitDataset:
    """Inputs by name (each (n, ...)) and labels (n,) int32 class ids, in the order every epoch visits them."""

    inputs: dict[str, np.ndarray]
    labels: np.ndarray

    @property
    def size(self) -> int:
        return int(self.labels.shape[0])


@dataclass
class FitResult:
    """What one framework's ``fit`` returns. ``epoch_s``: wall seconds per epoch as the user's loop sees them
    (epoch 1 includes tracing/compilation); ``epoch_loss``: the mean training loss of each epoch's batches;
    ``logits``: (n, classes) of the whole dataset after training (computed untimed); ``total_s``: the whole
    call, set-up (DataLoader, tf.data, Trainer, model.compile) included; ``loop``: what the loop is."""

    loop: str
    epoch_s: list[float]
    epoch_loss: list[float]
    logits: np.ndarray
    total_s: float
    extra: dict[str, Any] = field(default_factory=dict)


def make_fit_dataset(description: ModelDescription, n: int, seed: int) -> FitDataset:
    """The seeded dataset of ``n`` samples (see the module docstring); raises if the model has no fit phase."""
    if (reason := description.fit_unsupported()) is not None:
        raise NotImplementedError(reason)
    inputs = description.make_inputs(n, None, seed)
    weights = description.canonical_weights(seed + 1)
    chunks = []
    for start in range(0, n, TEACHER_CHUNK):  # in chunks: ResNet's im2col of n images at once would not fit
        teacher = description.reference_forward(
            weights, {k: a[start : start + TEACHER_CHUNK] for k, a in inputs.items()}
        )
        if teacher is None:
            raise NotImplementedError(f"{description.name} has no float64 reference to label a fit dataset with")
        chunks.append(teacher[description.output_names[0]])
    logits = np.concatenate(chunks)  # (n, classes) float64
    if description.fit_teacher_centred:
        logits = logits - logits.mean(axis=0)
    return FitDataset(inputs, logits.argmax(-1).astype(np.int32))


def evaluate(logits: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Mean softmax cross-entropy (float64) and accuracy (fraction of argmax == label) of (n, classes) logits."""
    loss = reference_loss(logits, labels, np.ones(labels.shape, dtype=np.float32))
    return {"loss": loss, "accuracy": float((logits.argmax(-1) == labels).mean())}


def fit_tolerance(model: str | None) -> tuple[float, float]:
    """(loss rtol, accuracy atol) of ``model``'s fit agreement: FIT_TOLERANCES' entry, else the defaults."""
    return FIT_TOLERANCES.get(model or "", (FIT_LOSS_RTOL, FIT_ACCURACY_ATOL))


def agreement(final: dict[str, float], reference: dict[str, float], model: str | None = None) -> dict[str, Any]:
    """``final`` (evaluate's dict) against the reference loop's: relative loss difference, accuracy difference,
    ``ok`` within the model's tolerance (fit_tolerance)."""
    rtol, atol = fit_tolerance(model)
    rel = abs(final["loss"] - reference["loss"]) / abs(reference["loss"])
    acc = abs(final["accuracy"] - reference["accuracy"])
    return {
        "loss_rel_diff": rel,
        "accuracy_diff": acc,
        "ok": rel <= rtol and acc <= atol,
        "loss_rtol": rtol,
        "accuracy_atol": atol,
    }


# -- phase fit from the data phase's images (Settings.fit_source "input") ----------------------------------------
def image_fit_dataset(folder: Path, crop: int, exclude: frozenset[str] = frozenset()) -> FitDataset:
    """The evaluation set of a fit from images: every image of ``folder`` (but ``exclude``) through the numpy
    ``center-crop`` reference, NCHW ``pixel_values`` (n, 3, crop, crop) float32 as the models take them, and its
    labels (n,) int32 (labels.csv). The epochs read the images through a loader instead (:class:`fwbench.datasets.images.LoaderInput`);
    the final loss and accuracy are of this set."""
    labels = images.read_labels(folder, exclude)
    pixels = np.empty((len(labels), 3, crop, crop), dtype=np.float32)
    for index, (file, _) in enumerate(labels):
        with Image.open(folder / file) as image:
            pixels[index] = transforms.center_crop(np.asarray(image.convert("RGB")), crop).transpose(2, 0, 1)
    return FitDataset({"pixel_values": pixels}, np.array([label for _, label in labels], dtype=np.int32))


FETCH_WAIT = (
    "per step, the time the loop spent getting its next batch from the loader, its step finished (torch and "
    "TensorFlow steps on a CPU have when they return; the JAX loop waits for each step's result)"
)


class WaitClock:
    """Seconds a fit loop spent waiting for its next batch, epoch by epoch. A manual loop iterates
    :meth:`batches` (the time inside each ``next()`` on the loader, getting the iterator included, is the wait);
    a loop run by a library reports through hooks: :meth:`step_done` at a step's end, :meth:`batch_ready` at the
    next step's start (the wait: between the two). Epochs are bracketed by :meth:`start_epoch` and
    :meth:`end_epoch`."""

    def __init__(self) -> None:
        self.epoch_wait_s: list[float] = []
        self.waits_s: list[float] = []  # every step's wait, all epochs
        self._mark = 0.0
        self._epoch = 0.0

    def start_epoch(self) -> None:
        self._epoch, self._mark = 0.0, time.perf_counter()

    def _add(self, wait: float) -> None:
        self._epoch += wait
        self.waits_s.append(wait)

    def batches(self, iterable: Iterable[Any]) -> Iterator[Any]:
        """``iterable``'s batches, each fetch timed as a wait (the loop's step runs between two fetches)."""
        start = time.perf_counter()
        iterator = iter(iterable)
        while True:
            try:
                batch = next(iterator)
            except StopIteration:
                return
            self._add(time.perf_counter() - start)
            yield batch
            start = time.perf_counter()

    def batch_ready(self) -> None:
        self._add(time.perf_counter() - self._mark)

    def step_done(self) -> None:
        self._mark = time.perf_counter()

    def end_epoch(self) -> None:
        self.epoch_wait_s.append(self._epoch)

    def report(self, epoch_s: list[float], loader: str, layout: str, measured_as: str = FETCH_WAIT) -> dict[str, Any]:
        """``details.fit.input``: the loader, per-epoch waits and their fraction of the epoch (epochs 2.., the
        samples, give ``wait_fraction``), the longest single wait and how the waits were measured."""
        later = [w / s for w, s in zip(self.epoch_wait_s[1:], epoch_s[1:]) if s > 0]
        return {
            "loader": loader,
            "layout": layout,
            "epoch_wait_s": self.epoch_wait_s,
            "wait_fraction": sum(later) / len(later) if later else None,
            "max_step_wait_s": max(self.waits_s, default=0.0),
            "measured_as": measured_as,
        }

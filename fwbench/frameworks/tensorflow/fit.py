"""Phase fit in TensorFlow (``tensorflow:function``): the custom training loop of TensorFlow's guide, a
Python ``for`` over ``tf.data.Dataset.from_tensor_slices((inputs, labels)).batch(batch_size)`` (no shuffle)
calling one tf.function step (forward + mean sparse softmax cross-entropy under tf.GradientTape, a Keras 3
optimizer's apply_gradients on the model's tf.Variables). fwbench.models.fit says what is trained. ResNet:
batch norm in training form in the step (batch statistics, running statistics assigned inside it); the final
logits in inference form (``inference_logits``: BN refolded from the trained variables, running statistics).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable

import numpy as np
import tensorflow as tf

from fwbench.datasets.images import LoaderInput
from fwbench.frameworks.base import Backend
from fwbench.frameworks.keras3 import import_keras
from fwbench.frameworks.roles import as_evaluated_arch, as_training_arch
from fwbench.frameworks.tensorflow import data as tf_data
from fwbench.models.fit import EpochEnd, FitDataset, FitResult, WaitClock, no_pause
from fwbench.models.training import optimizer_spec


def fit(
    backend: Backend,
    dataset: FitDataset,
    epochs: int,
    batch_size: int,
    epoch_end: EpochEnd = no_pause,
    loader: LoaderInput | None = None,
) -> FitResult:
    """``epochs`` epochs of ``dataset`` in batches of ``batch_size`` (see the module docstring). With ``loader``
    the epochs read the images through tensorflow:data's pipeline instead (NHWC batches, transposed to the models'
    NCHW inside the step), and the loop's waits for it are reported (``extra["input"]``); ``dataset`` is then the
    evaluation set only."""
    assert backend.description is not None
    if backend.mode != "function":
        raise NotImplementedError(f"tensorflow:{backend.mode} has no fit phase")
    import_keras("tensorflow", backend.device)  # Keras 3's optimizers, on its tensorflow backend
    from fwbench.frameworks.keras3.optimizers import make_optimizer

    arch = as_training_arch(backend.arch_module())
    evaluated = as_evaluated_arch(backend.arch_module())
    model, device = backend.model, backend._tf_device  # type: ignore[attr-defined]
    variables = list(model.trainable_variables)
    n_inputs = len(dataset.inputs)
    epoch_s: list[float] = []
    epoch_loss: list[float] = []
    started = time.perf_counter()
    with tf.device(device):
        optimizer = make_optimizer(optimizer_spec(backend.settings.optimizer))
        optimizer.build(variables)
        if loader is None:
            # drop_remainder drops nothing (batch_size divides the samples) and gives the batches a static shape
            data = tf.data.Dataset.from_tensor_slices((*dataset.inputs.values(), dataset.labels)).batch(
                batch_size, drop_remainder=True
            )

            def epoch_batches() -> Iterable[tuple[tf.Tensor, ...]]:
                return data

        else:  # the dataset's JPEGs, every epoch in one pipeline (new random crops each epoch): (images NHWC, labels)
            pipeline = iter(
                tf_data.make_loader(
                    loader.folder, batch_size, loader.workers, loader.crop, loader.transform, loader.seed,
                    epochs=epochs, exclude=loader.exclude,
                )
            )  # fmt: skip
            steps = dataset.size // batch_size  # the pipeline drops each epoch's last incomplete batch

            def epoch_batches() -> Iterable[tuple[tf.Tensor, ...]]:
                return itertools.islice(pipeline, steps)

        @tf.function(reduce_retracing=True)
        def train_step(*batch: tf.Tensor) -> tf.Tensor:
            xs, labels = batch[:n_inputs], batch[n_inputs]
            if loader is not None:
                xs = (tf.transpose(xs[0], (0, 3, 1, 2)),)  # NHWC → NCHW, what the models take
            with tf.GradientTape() as tape:
                logits = arch.training_logits(model, *xs)
                loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
            optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
            return loss

        clock = WaitClock()
        for _ in range(epochs):
            epoch_start = time.perf_counter()
            total, batches = tf.zeros(()), 0
            clock.start_epoch()
            for batch in clock.batches(epoch_batches()):
                total += train_step(*batch)
                batches += 1
            clock.end_epoch()
            mean = float(total) / batches  # reads the loss: the epoch's work has finished
            epoch_s.append(time.perf_counter() - epoch_start)
            epoch_loss.append(mean)
            epoch_end(epoch_s[-1])
        total_s = time.perf_counter() - started
        logits = evaluated.inference_logits(model, *(tf.constant(a) for a in dataset.inputs.values()))
    extra: dict[str, object] = {"traces": int(train_step.experimental_get_tracing_count())}
    if loader is not None:
        extra["input"] = clock.report(epoch_s, "tensorflow:data", tf_data.LAYOUT)
    return FitResult(
        "manual tf.data loop + tf.function step" + (" over the dataset's JPEGs" if loader is not None else ""),
        epoch_s,
        epoch_loss,
        np.asarray(logits, dtype=np.float32),
        total_s,
        extra,
    )

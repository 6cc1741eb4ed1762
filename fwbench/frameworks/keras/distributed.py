"""keras:jax-dataparallel: Keras 3's own data parallelism, ``keras.distribution.DataParallel`` on the JAX backend,
one process per device.

The processes are joined by jax:distributed's ``initialize`` (fwbench.frameworks.jax.distributed: the coordinator
and gloo on 127.0.0.1), not ``keras.distribution.initialize``, which starts the coordinator on every interface.
Then a ``DataParallel`` distribution over every process's device is set before the model is built, so its variables
are replicated. ``train_on_batch`` is given this process's rows (``auto_shard_dataset=False``: the rows are already
this process's); Keras makes the global batch of them (``jax.make_array_from_process_local_data``), and its train
step's loss (weighted mean over the sample weights) is the global batch's, so XLA all-reduces the gradients.
"""

from __future__ import annotations

from types import ModuleType


def set_data_parallel(keras: ModuleType) -> None:
    """Keras' distribution for this process: data parallel over every process's device, inputs already split."""
    devices = keras.distribution.list_devices()
    keras.distribution.set_distribution(keras.distribution.DataParallel(devices=devices, auto_shard_dataset=False))

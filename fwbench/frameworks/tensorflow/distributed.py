"""tensorflow:multiworker: one of N workers of a data-parallel training step under
``tf.distribute.MultiWorkerMirroredStrategy``.

fwbench builds ``TF_CONFIG`` from the rank's identity (fwbench.ranks.RankInfo): worker r at its host (127.0.0.1 on
one machine) and the port fwbench chose free there. The strategy uses RING collectives (``CommunicationOptions``); it is created
right after the thread settings, before any other TensorFlow op, as TensorFlow requires. TensorFlow's gRPC server
binds every interface (``0.0.0.0``, hard-coded in grpc_server_lib.cc; the host in TF_CONFIG is only dialled), so
unlike the other runtimes a multiworker cell listens off loopback while it runs.

The step, one tf.function: ``strategy.run`` of the replica step (each worker has one replica, fed its rows of the
global batch): the global weight sum (all-reduced), forward + loss Σ_r w·CE / Σ w under ``tf.GradientTape``, the
gradients all-reduced (SUM) in one call, and the global loss; then the Keras 3 optimizer's ``apply_gradients`` on the
worker's own variables, outside the replica context. The variables are plain (built before the strategy's scope),
updated identically on every worker by identical summed gradients: what DDP does, with TensorFlow's collectives.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from fwbench.ranks import RankInfo


def create_strategy() -> tf.distribute.MultiWorkerMirroredStrategy:
    """TF_CONFIG for this worker, then the strategy (it waits for every worker to join)."""
    info = RankInfo.current()
    if info is None:
        raise RuntimeError("tensorflow:multiworker runs as one worker of a distributed cell (fwbench run --procs N)")
    workers = [info.rank_address(rank) for rank in range(info.world_size)]
    os.environ["TF_CONFIG"] = json.dumps(
        {"cluster": {"worker": workers}, "task": {"type": "worker", "index": info.rank}}
    )
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING
    )
    return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)


def make_train_step(
    strategy: tf.distribute.Strategy,
    logits_of: Callable[..., tf.Tensor],
    model: Any,
    variables: Sequence[tf.Variable],
    optimizer: Any,
    inputs: Sequence[tf.Tensor],
    targets: Sequence[tf.Tensor],
) -> Callable[[], tf.Tensor]:
    """The worker's timed call: the replica step (global weight sum, forward + loss, summed gradients, global loss)
    under ``strategy.run``, then ``optimizer.apply_gradients``; one tf.function with the cell's signature."""
    n_inputs = len(inputs)
    tensors = (*inputs, *targets)
    total = tf.distribute.ReduceOp.SUM

    def replica_step(*values: tf.Tensor) -> tuple[list[tf.Tensor], tf.Tensor]:
        batch, (labels, weights) = values[:n_inputs], values[n_inputs:]
        context = tf.distribute.get_replica_context()
        weight_sum = context.all_reduce(total, tf.reduce_sum(weights))
        with tf.GradientTape() as tape:
            logits = tf.cast(logits_of(model, *batch), tf.float32)
            per_position = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
            loss = tf.reduce_sum(per_position * weights) / weight_sum
        gradients = [tf.convert_to_tensor(g) for g in tape.gradient(loss, variables)]
        return context.all_reduce(total, gradients), context.all_reduce(total, loss)

    def train_step(*values: tf.Tensor) -> tf.Tensor:
        gradients, loss = strategy.run(replica_step, args=values)
        local = [strategy.experimental_local_results(g)[0] for g in gradients]
        optimizer.apply_gradients(zip(local, variables))
        return strategy.experimental_local_results(loss)[0]

    signature = [tf.TensorSpec(t.shape, t.dtype) for t in tensors]
    compiled = tf.function(train_step, input_signature=signature)

    def step() -> tf.Tensor:
        loss = compiled(*tensors)
        loss.numpy()  # block until the step (and its collectives) finished
        return loss

    step.traced = compiled  # type: ignore[attr-defined]  # what compile_counters counts the traces of
    return step


_BARRIERS: dict[int, Callable[[], tf.Tensor]] = {}


def barrier(strategy: tf.distribute.Strategy) -> None:
    """Return once every worker got here: a one-number all-reduce (RING), traced once per strategy."""
    if id(strategy) not in _BARRIERS:
        one = tf.ones([1], tf.float32)

        def reduce() -> tf.Tensor:
            return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, tf.identity(one))

        _BARRIERS[id(strategy)] = tf.function(lambda: strategy.experimental_local_results(strategy.run(reduce))[0])
    _BARRIERS[id(strategy)]().numpy()


def allreduce_seconds(strategy: tf.distribute.Strategy, elements: int, repeats: int) -> list[float]:
    """Seconds of ``repeats`` all-reduces (sum) of ``elements`` float32 values over the workers (RING), each after
    a one-number all-reduce that lines the workers up; traced once, untimed."""
    buffer = tf.zeros([elements], tf.float32)
    one = tf.ones([1], tf.float32)

    def reduce(value: tf.Tensor) -> tf.Tensor:
        return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, tf.identity(value))

    @tf.function
    def collective(value: tf.Tensor) -> tf.Tensor:
        return strategy.experimental_local_results(strategy.run(reduce, args=(value,)))[0]

    collective(buffer).numpy()
    collective(one).numpy()
    seconds = []
    for _ in range(repeats):
        collective(one).numpy()  # a barrier
        start = time.perf_counter()
        collective(buffer).numpy()
        seconds.append(time.perf_counter() - start)
    return seconds

"""How far a runtime may be from the reference, and the one way that distance is measured.

:func:`relative_errors` (relative L2 error ‖got − expected‖ / ‖expected‖ and max absolute error, in float64)
is used by the worker's parity check (fwbench.runner.phases) and by ``fwbench verify`` (fwbench.runner.verify).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

# Parity tolerance on the relative L2 error against the model's float64 reference, per dtype: what a model
# without a limit of its own gets (bf16: BF16_PARITY_LIMIT), and the training loss check's.
PARITY_REL_L2_TOLERANCE = {"fp32": 1e-4, "bf16": 2e-2, "int8": 0.1}

# bf16 (the mixed-precision policy, fwbench.precision): each zoo model's limit is BF16_MARGIN times the worst
# output's relative L2 error of the reference policy, torch:eager under autocast, at the model's parity shape
# (batch 2, seq 16; gemm 4; seed 0), rounded up to two digits, measured 2026-12-05 on an AVX2 CPU without bf16
# units with `fwbench verify --models <models> --runtimes torch:eager,jax:jit,tensorflow:function,keras:jax
# --dtype bf16 --threads 1` (docs/precision.md has the table of every runtime's errors). The margin covers the other
# frameworks' ways of applying the same policy (TensorFlow's bfloat16 MatMul adds its bias in bfloat16 and rounds
# the attention scores: up to 2.7x torch's error on the MLP) and another CPU's kernels; it is not what tells a
# runtime computing another precision apart — the observed dtypes and the consistency flag
# (fwbench.report.flags.precision_flags) are.
BF16_MARGIN = 4.0
BF16_REFERENCE_ERROR = {
    "mlp": 3.19e-3,
    "bert-tiny": 2.97e-3,
    "bert-base": 6.36e-3,
    "distilbert-base": 3.76e-3,
    "gpt2-tiny": 5.43e-3,
    "gpt2": 8.84e-3,
    "llama-tiny": 5.57e-3,  # the Llama layout's two: 2026-12-07, a 2-core AMD EPYC with AVX2 only, --threads 2
    "smollm-135m": 1.12e-2,
    "resnet-tiny": 4.36e-3,
    "resnet50": 4.11e-3,
    "gemm": 2.90e-3,
}


def _round_up(value: float, digits: int = 2) -> float:
    """``value`` rounded up to ``digits`` significant digits."""
    scale = 10.0 ** (math.floor(math.log10(value)) - digits + 1)
    return round(math.ceil(value / scale - 1e-9) * scale, 12)


BF16_PARITY_LIMIT = {model: _round_up(error * BF16_MARGIN) for model, error in BF16_REFERENCE_ERROR.items()}


# int8 (the deployment engines' dynamic quantisation, docs/runtimes.md): each zoo model's limit is INT8_MARGIN times
# the worst output's relative L2 error of any int8 engine (onnxruntime:torch, onnxruntime:tensorflow,
# litert:tensorflow) at the model's parity shape (batch 2, seq 16; seed 0), rounded up to two digits, measured
# 2026-12-05 on an Intel Xeon with AVX-512 VNNI with `fwbench verify --models <models> --runtimes
# onnxruntime:torch,onnxruntime:tensorflow,litert:tensorflow --dtype int8 --threads 2`. The weights are quantised
# the same on every CPU (ORT with reduce_range, so AVX2's saturating multiply-adds compute VNNI's integers) and
# the integer arithmetic is exact, so the errors depend on the model, not the CPU; the margin also covers the
# engines' comparison with each other in `verify` (their quantisations differ: up to 1.1x the worst error here).
# Models not listed (plugins) get PARITY_REL_L2_TOLERANCE["int8"].
INT8_MARGIN = 2.0
INT8_WORST_ERROR = {
    "mlp": 0.0104, "bert-tiny": 0.0223, "gpt2-tiny": 0.0438, "resnet-tiny": 0.0500,
    "bert-base": 0.0550, "distilbert-base": 0.0340, "gpt2": 0.0770, "resnet50": 0.0492,
    "llama-tiny": 0.0398, "smollm-135m": 0.104,  # 2026-12-07, a 2-core AMD EPYC with AVX2 only (ORT's, both)
}  # fmt: skip
INT8_PARITY_LIMIT = {model: _round_up(error * INT8_MARGIN) for model, error in INT8_WORST_ERROR.items()}


def parity_tolerance(model: str, dtype: str) -> float:
    """The relative L2 limit on ``model``'s outputs against its float64 reference in ``dtype``: 1e-4 for fp32,
    the model's own bf16 or int8 limit (BF16_PARITY_LIMIT, INT8_PARITY_LIMIT), else PARITY_REL_L2_TOLERANCE[dtype]."""
    if dtype == "bf16" and model in BF16_PARITY_LIMIT:
        return BF16_PARITY_LIMIT[model]
    if dtype == "int8" and model in INT8_PARITY_LIMIT:
        return INT8_PARITY_LIMIT[model]
    return PARITY_REL_L2_TOLERANCE[dtype]


def relative_errors(got: npt.ArrayLike, expected: npt.ArrayLike) -> tuple[float, float]:
    """(relative L2 error, max absolute error) of ``got`` against ``expected`` (arrays of the same shape, or
    two scalars), in float64. Shapes that differ give (inf, inf); an all-zero ``expected`` divides by 1."""
    got64, expected64 = np.asarray(got, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    if got64.shape != expected64.shape:
        return float("inf"), float("inf")
    difference = got64 - expected64
    denominator = float(np.linalg.norm(expected64)) or 1.0
    return float(np.linalg.norm(difference)) / denominator, float(np.max(np.abs(difference), initial=0.0))


@dataclass(frozen=True)
class TrainingTolerance:
    """``fwbench verify --phase training`` limits against the first runtime: ``loss_rel`` on the loss curve's
    max relative error over steps, ``params_rel_l2`` on the relative L2 error of all trained parameters
    concatenated, ``tensor_rel_l2`` on the worst single parameter tensor's relative L2 error."""

    loss_rel: float
    params_rel_l2: float
    tensor_rel_l2: float


# fp32, measured 2026-12-03 (20 AdamW steps, lr 1e-3, parity shape, 1 thread; torch:eager first against
# tensorflow:eager/function, jax:jit, keras:jax/torch/tensorflow on mlp, bert-tiny, gpt2-tiny), worst seen:
# loss curve 3.3e-5, all parameters 5.8e-4, single tensor 7.0e-2 (attention query/key biases, whose gradient
# is ~0 in exact arithmetic: Adam normalises rounding noise into full-size steps). Limits ≈ 30×, 9×, 3.5× that.
# keras:tensorflow on bert-tiny is the one outlier (loss 1.5e-3, parameters 1.4e-2): caught, as it should be.
# bf16 (mixed precision), measured 2026-12-03 the same way on mlp, bert-tiny, gpt2-tiny, resnet-tiny in torch:eager
# (first) against tensorflow (eager, function, xla), jax:jit, keras:*, torch:compile: text models and the MLP
# ≤ 5.4e-3 / 7.4e-3 / 0.34; resnet-tiny, which memorises its batch (loss 2.25 → 0.0084, so relative errors of the
# late losses grow), loss curve ≤ 7.7e-2, parameters ≤ 8.1e-2, worst tensor 0.39 (layer4.0.bn2.running_mean,
# means over N·H·W = 8 values); torch:compile against torch:eager alone gives 2.3e-2 / 6.3e-2 / 0.29.
TRAINING_TOLERANCE = {
    "fp32": TrainingTolerance(loss_rel=1e-3, params_rel_l2=5e-3, tensor_rel_l2=0.25),
    "bf16": TrainingTolerance(loss_rel=0.15, params_rel_l2=0.15, tensor_rel_l2=1.0),
}

# fwbench diff --phase training: each trained tensor's gradient against the first runtime's (fwbench.runner.divergence
# gradient_errors; there is no float64 gradient), measured 2026-12-06 at the parity shape against torch:eager with
# torch:compile, tensorflow:eager/xla, jax:jit, keras:jax/tensorflow/torch. fp32: worst 2.1e-5 (resnet-tiny bn1.bias,
# torch:compile), every runtime ≤ that on mlp, bert-tiny, gpt2-tiny, resnet-tiny (Keras's, read off an SGD step of
# learning rate 2**20, ≤ 1.2e-5); 1e-3 is ~50x that. bf16: text models and the MLP ≤ 2.8e-2 (attention key biases),
# 0.1 is ~3.5x that; resnet-tiny's early batch-norm biases up to 0.51 (their gradient sums a bf16 convolution's output
# over N·H·W positions), so the ResNets get 1.0, as in TRAINING_TOLERANCE.
GRADIENT_TOLERANCE = {"fp32": 1e-3, "bf16": 0.1}
BF16_GRADIENT_LIMIT = {"resnet-tiny": 1.0, "resnet50": 1.0}


def gradient_tolerance(model: str, dtype: str) -> float:
    """The limit on one tensor's gradient error against the first runtime's, for ``model`` in ``dtype``."""
    if dtype == "bf16" and model in BF16_GRADIENT_LIMIT:
        return BF16_GRADIENT_LIMIT[model]
    return GRADIENT_TOLERANCE[dtype]

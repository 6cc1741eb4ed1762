"""Each phase's FLOP count against the matmuls and convolutions a model actually runs: torch's FlopCounterMode
counts every mm / bmm / attention / convolution torch:eager dispatches in one inference forward and in one optimizer
step, and the phase's ``flops_per_call`` must match what it counted.

True by construction: an inference forward is exactly the model's matmuls and convolutions (normalisation, GELU and
embedding look-ups are not counted on either side); a training step is its training forward F (BERT's includes the
tied vocabulary projection of its masked-LM loss) plus a backward of between F (weight gradients only) and 2F (every
input gradient too: the first layer's input needs none), so the 3F the phase counts is at least the step and at most
1.5 times it."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from fwbench.frameworks import create_backend
from fwbench.frameworks.base import Backend
from fwbench.models import get_model
from fwbench.runner.phases import get_phase
from fwbench.spec import Case, Settings

SHAPES = {"mlp": (4, None), "bert-tiny": (2, 16), "gpt2-tiny": (2, 16), "resnet-tiny": (2, None)}


def _cpu_attention_flops(
    query: tuple[int, ...], key: tuple[int, ...], value: tuple[int, ...], *_: object, **__: object
) -> int:
    """FlopCounterMode's formula for CUDA's fused attention, for the CPU kernel it has none for (QKᵀ and PV)."""
    return int(sdpa_flop_count(query, key, value))


def counted(call: Callable[[], object]) -> int:
    """The FLOPs torch's FlopCounterMode counts in one call of ``call`` (the CPU's fused attention included)."""
    mapping = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_attention_flops}
    with FlopCounterMode(display=False, custom_mapping=mapping) as counter:
        call()
    return int(counter.get_total_flops())


def _backend(model: str, phase: str) -> Backend:
    description = get_model(model)
    backend = create_backend("torch:eager", "cpu", Settings(), phase=phase)
    backend.configure_threads(1, 1)
    backend.configure_precision()
    backend.build(description, description.canonical_weights(0))
    return backend


@pytest.mark.parametrize("model", sorted(SHAPES))
def test_inference_flops_are_the_matmuls_a_forward_runs(model: str) -> None:
    batch, seq = SHAPES[model]
    description = get_model(model)
    backend = _backend(model, "inference")
    inputs = backend.make_inputs(description.make_inputs(batch, seq, 0))
    backend.compile(inputs)
    with torch.inference_mode():
        measured = counted(lambda: backend.infer(inputs))
    case = Case(model, "torch:eager", "inference", batch, seq)
    assert get_phase("inference").flops_per_call(description, case, Settings()) == pytest.approx(measured, rel=1e-6)


@pytest.mark.parametrize("model", sorted(SHAPES))
def test_training_flops_count_the_loss_and_the_backward(model: str) -> None:
    batch, seq = SHAPES[model]
    description = get_model(model)
    backend = _backend(model, "training")
    arrays, targets = description.make_inputs(batch, seq, 0), description.make_targets(batch, seq, 0)
    step = backend.make_train_step(backend.make_inputs(arrays), backend.make_targets(targets))
    measured = counted(step)
    case = Case(model, "torch:eager", "training", batch, seq)
    predicted = get_phase("training").flops_per_call(description, case, Settings())
    assert predicted is not None
    assert measured <= predicted <= 1.5 * measured, (measured, predicted)


def test_bert_training_counts_its_vocabulary_projection() -> None:
    """bert-tiny s64 b8: the tied logits (2·8·64·128·30522 ≈ 4.0 GFLOP forward) dwarf the encoder (≈ 0.44 GFLOP);
    a count without them was ~10× too low."""
    description = get_model("bert-tiny")
    case = Case("bert-tiny", "torch:eager", "training", 8, 64)
    projection = 2 * 8 * 64 * 128 * 30522
    step = get_phase("training").flops_per_call(description, case, Settings())
    assert step == 3 * (8 * description.forward_flops(1, 64) - 8 * 2 * 128**2 + projection)  # no pooler in training

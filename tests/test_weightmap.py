"""fwbench.models.weightmap, the one weight-loading path of every framework: its layout transforms, the checked
taker and the name-map checks, framework-free (numpy only)."""

from __future__ import annotations

import numpy as np
import pytest

from fwbench.models.weightmap import WeightTaker, check_weight_map, hwio, identity, mapped_weights, transpose


def weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "conv.weight": rng.standard_normal((8, 3, 5, 7)).astype(np.float32),  # (out, in, kh, kw)
        "fc.weight": rng.standard_normal((4, 6)).astype(np.float32),  # (out, in)
        "fc.bias": rng.standard_normal(4).astype(np.float32),
    }


def test_identity_keeps_the_array() -> None:
    value = weights()["fc.bias"]
    assert identity(value) is value


def test_transpose_gives_in_out_kernels() -> None:
    value = weights()["fc.weight"]
    kernel = transpose(value)
    assert kernel.shape == (6, 4) and kernel.flags.c_contiguous
    np.testing.assert_array_equal(kernel, value.T)
    np.testing.assert_array_equal(transpose(kernel), value)  # and back (GPT-2's Conv1D weights in torch)


def test_hwio_gives_channels_last_conv_kernels() -> None:
    value = weights()["conv.weight"]
    kernel = hwio(value)
    assert kernel.shape == (5, 7, 3, 8) and kernel.flags.c_contiguous
    assert kernel[1, 2, 0, 6] == value[6, 0, 1, 2]
    with pytest.raises(ValueError):
        hwio(np.zeros((3, 3), np.float32))


def take_all(taker: WeightTaker) -> dict[str, np.ndarray]:
    return {
        "conv": taker.take("conv.weight", (5, 7, 3, 8), hwio),
        "fc": taker.take("fc.weight", (6, 4), transpose),
        "bias": taker.take("fc.bias", (4,)),
    }


def test_the_taker_hands_out_each_tensor_transformed() -> None:
    tensors = weights()
    taker = WeightTaker(tensors)
    taken = take_all(taker)
    taker.check_all_used()
    np.testing.assert_array_equal(taken["conv"], tensors["conv.weight"].transpose(2, 3, 1, 0))
    np.testing.assert_array_equal(taken["fc"], tensors["fc.weight"].T)
    assert taken["bias"] is tensors["fc.bias"]


def test_a_missing_tensor_is_named() -> None:
    tensors = weights()
    del tensors["fc.bias"]
    with pytest.raises(ValueError, match=r"^weight map: tensor fc\.bias missing from the canonical weights$"):
        take_all(WeightTaker(tensors))


def test_a_tensor_taken_twice_is_named() -> None:
    taker = WeightTaker(weights())
    taker.take("fc.bias", (4,))
    with pytest.raises(ValueError, match=r"^weight map: tensor fc\.bias mapped twice$"):
        taker.take("fc.bias", (4,))


def test_a_wrong_shape_is_named() -> None:
    taker = WeightTaker({**weights(), "fc.weight": np.zeros((3, 3), np.float32)})
    with pytest.raises(ValueError, match=r"^fc\.weight: shape \(3, 3\), expected \(6, 4\)$"):
        taker.take("fc.weight", (6, 4), transpose)
    # the shape before and after the transform when they differ, and the variable where there is one
    taker = WeightTaker({"fc.weight": np.zeros((4, 5), np.float32)})
    with pytest.raises(ValueError, match=r"^fc\.weight -> fc/kernel: shape \(4, 5\) \(\(5, 4\) after mapping\), "):
        taker.take("fc.weight", (6, 4), transpose, target="fc/kernel")
    # a transform that does not fit the tensor (hwio of a 2-D one) is a wrong shape too
    with pytest.raises(ValueError, match=r"^conv\.weight: shape \(3, 3\), expected \(5, 7, 3, 8\)$"):
        WeightTaker({"conv.weight": np.zeros((3, 3), np.float32)}).take("conv.weight", (5, 7, 3, 8), hwio)
    # a conv weight of the right rank with its in/out axes swapped
    swapped = weights()["conv.weight"].transpose(1, 0, 2, 3)
    with pytest.raises(ValueError, match=r"^conv\.weight: shape \(3, 8, 5, 7\) \(\(5, 7, 8, 3\) after mapping\)"):
        WeightTaker({"conv.weight": swapped}).take("conv.weight", (5, 7, 3, 8), hwio)


def test_a_misshapen_tensor_is_not_counted_as_taken() -> None:
    taker = WeightTaker({"fc.bias": np.zeros(3, np.float32)})
    with pytest.raises(ValueError, match="fc.bias: shape"):
        taker.take("fc.bias", (4,))
    with pytest.raises(ValueError, match=r"tensors unused \['fc\.bias'\]"):
        taker.check_all_used()


def test_a_tensor_left_over_is_named() -> None:
    taker = WeightTaker({**weights(), "extra.weight": np.zeros(2, np.float32)})
    take_all(taker)
    with pytest.raises(ValueError, match=r"^weight map: tensors unused \['extra\.weight'\]$"):
        taker.check_all_used()


FULL_MAP = {"conv.weight": "conv/kernel", "fc.weight": "fc/kernel", "fc.bias": "fc/bias"}
TARGETS = {"conv/kernel": (5, 7, 3, 8), "fc/kernel": (6, 4), "fc/bias": (4,)}


def test_a_bijective_map_passes() -> None:
    check_weight_map(set(TARGETS), FULL_MAP, weights())


@pytest.mark.parametrize(
    ("targets", "mapping", "tensors", "message"),
    [
        (  # a variable no tensor sets
            {*TARGETS, "fc2/bias"},
            FULL_MAP,
            weights(),
            r"variables unset \['fc2/bias'\], unknown \[\], tensors unused \[\], tensors missing \[\]",
        ),
        (  # a variable the model does not have
            set(TARGETS),
            {**FULL_MAP, "fc.bias": "fc9/bias"},
            weights(),
            r"variables unset \['fc/bias'\], unknown \['fc9/bias'\]",
        ),
        (  # a tensor the map leaves out
            set(TARGETS),
            {k: v for k, v in FULL_MAP.items() if k != "fc.bias"} | {"extra.bias": "fc/bias"},
            {**weights(), "extra.bias": np.zeros(4, np.float32)},
            r"tensors unused \['fc\.bias'\], tensors missing \[\]",
        ),
        (  # a tensor the weights do not have
            set(TARGETS),
            FULL_MAP,
            {k: v for k, v in weights().items() if k != "fc.bias"},
            r"tensors unused \[\], tensors missing \['fc\.bias'\]",
        ),
        (  # two tensors onto one variable
            set(TARGETS),
            {**FULL_MAP, "extra.bias": "fc/bias"},
            {**weights(), "extra.bias": np.zeros(4, np.float32)},
            r"^weight map: a variable is the target of more than one tensor$",
        ),
    ],
    ids=["unset", "unknown", "unused", "missing", "twice"],
)
def test_a_map_that_is_no_bijection_is_refused(
    targets: set[str], mapping: dict[str, str], tensors: dict[str, np.ndarray], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        check_weight_map(targets, mapping, tensors)
    with pytest.raises(ValueError, match=message):
        dict(mapped_weights({t: TARGETS.get(t, (4,)) for t in targets}, mapping, tensors))


def test_mapped_weights_gives_each_variable_its_value() -> None:
    tensors = weights()
    values = dict(mapped_weights(TARGETS, FULL_MAP, tensors, {"conv.weight": hwio, "fc.weight": transpose}))
    assert list(values) == ["conv/kernel", "fc/kernel", "fc/bias"]  # the map's order
    np.testing.assert_array_equal(values["conv/kernel"], hwio(tensors["conv.weight"]))
    np.testing.assert_array_equal(values["fc/kernel"], tensors["fc.weight"].T)
    assert values["fc/bias"] is tensors["fc.bias"]  # no transform: identity


def test_mapped_weights_names_the_tensor_and_its_variable() -> None:
    with pytest.raises(ValueError, match=r"^fc\.weight -> fc/kernel: shape \(4, 6\), expected \(6, 4\)$"):
        dict(mapped_weights(TARGETS, FULL_MAP, weights(), {"conv.weight": hwio}))  # fc.weight left untransposed


def test_the_module_imports_no_framework() -> None:
    import subprocess
    import sys

    code = (
        "import sys, fwbench.models.weightmap; "
        "print(sorted({'torch', 'tensorflow', 'jax', 'keras'} & {m.split('.')[0] for m in sys.modules}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"

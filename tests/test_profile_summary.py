"""The framework-free half of ``fwbench profile`` on constructed traces: op selection from a Chrome trace, self
time of nested ops, the union of op intervals (overlapping ops counted once), overhead, and the category tables
(every op name lands in a category; unknown ones in ``other``, listed)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from fwbench.profile.categories import CATEGORIES, TABLES, Vocabulary, categorize
from fwbench.profile.summary import OpEvent, self_times_s, summarize, union_s
from fwbench.profile.trace import OP_RULES, op_events, read_chrome_trace

US = 1e-6


def test_union_counts_overlapping_intervals_once() -> None:
    assert union_s([]) == 0
    assert union_s([(0, 2), (1, 3)]) == pytest.approx(3)
    assert union_s([(0, 1), (2, 3)]) == pytest.approx(2)
    assert union_s([(0, 10), (2, 3), (4, 5)]) == pytest.approx(10)  # contained intervals add nothing
    assert union_s([(5, 6), (0, 1), (0.5, 5.5)]) == pytest.approx(6)  # unsorted input


def test_self_time_subtracts_direct_children_only() -> None:
    events = [
        OpEvent("aten::linear", 0.0, 10.0),  # children: addmm (6) and t (1)
        OpEvent("aten::t", 0.5, 1.0),
        OpEvent("aten::addmm", 2.0, 6.0),  # child: copy_ (2)
        OpEvent("aten::copy_", 3.0, 2.0),
        OpEvent("aten::relu", 11.0, 1.0),
    ]
    assert self_times_s(events) == pytest.approx([3.0, 1.0, 4.0, 2.0, 1.0])
    # the self times add up to the busy time on one lane: nothing double-counted
    assert sum(self_times_s(events)) == pytest.approx(union_s((e.start_s, e.end_s) for e in events))


def test_summary_per_call_with_overlap_overhead_and_other() -> None:
    events = [  # two profiled calls; in each, a matmul on lane a while an elementwise op runs on lane b
        OpEvent("MatMul", 0.0, 4.0, "a", "tensorflow"),
        OpEvent("AddV2", 2.0, 4.0, "b", "tensorflow"),  # overlaps the matmul for 2 s
        OpEvent("MyCustomOp", 6.0, 1.0, "a", "tensorflow"),
        OpEvent("MatMul", 10.0, 4.0, "a", "tensorflow"),
        OpEvent("AddV2", 12.0, 4.0, "b", "tensorflow"),
        OpEvent("MyCustomOp", 16.0, 1.0, "a", "tensorflow"),
    ]
    summary = summarize(events, calls=2, wall_s=20.0)
    assert summary.wall_s == pytest.approx(10.0)
    assert summary.busy_s == pytest.approx(7.0)  # [0, 6] and [6, 7]: overlap counted once
    assert summary.overlap_s == pytest.approx(2.0)  # 9 s of op self time in 7 s of busy time
    assert summary.overhead_s == pytest.approx(3.0)
    assert summary.busy_s <= summary.wall_s
    assert summary.categories_s["matmul/conv"] == pytest.approx(4.0)
    assert summary.categories_s["elementwise/activation"] == pytest.approx(4.0)
    assert summary.categories_s["other"] == pytest.approx(1.0)
    assert summary.uncategorized == ["MyCustomOp"]  # listed, so the table can be improved
    assert [row.name for row in summary.top(2)] == ["AddV2", "MatMul"]
    assert all(row.calls_per_call == 1 for row in summary.ops)
    with pytest.raises(ValueError, match="at least one profiled call"):
        summarize(events, calls=0, wall_s=1.0)


@pytest.mark.parametrize(
    ("vocabulary", "op", "category"),
    [
        ("torch", "aten::addmm", "matmul/conv"),
        ("torch", "aten::mkldnn_convolution", "matmul/conv"),
        ("torch", "aten::_softmax", "attention/softmax"),
        ("torch", "aten::_scaled_dot_product_flash_attention_for_cpu", "attention/softmax"),
        ("torch", "aten::native_layer_norm", "normalization"),
        ("torch", "aten::gelu", "elementwise/activation"),
        ("torch", "aten::transpose", "data movement"),
        ("torch", "aten::embedding", "data movement"),
        ("torch", "cpp_fused_add_gelu_3", "compiled fusion"),
        ("torch", "Torch-Compiled Region: 0/0", "compiled fusion"),
        ("tensorflow", "_MklNativeFusedMatMul", "matmul/conv"),
        ("tensorflow", "BatchMatMulV2", "matmul/conv"),
        ("tensorflow", "Softmax", "attention/softmax"),
        ("tensorflow", "FusedBatchNormV3", "normalization"),
        ("tensorflow", "Erf", "elementwise/activation"),
        ("tensorflow", "Transpose", "data movement"),
        ("tensorflow", "_XlaRun", "compiled fusion"),
        ("xla", "dot.12", "matmul/conv"),
        ("xla", "convolution.3", "matmul/conv"),
        ("xla", "fusion.7", "compiled fusion"),
        ("xla", "loop_add_fusion.1", "compiled fusion"),
        ("xla", "transpose.2", "data movement"),
        ("xla", "wrapped_reduce-window.1", "elementwise/activation"),
        ("xla", "ynn_fusion.15", "compiled fusion"),
        ("xla", "MatMul.22", "matmul/conv"),
        ("xla", "MatMul_1.30", "matmul/conv"),
        ("tensorflow", "BroadcastGradientArgs", "data movement"),
        ("xla", "add.4", "elementwise/activation"),
        ("torch", "aten::some_future_op", "other"),
        ("xla", "not-an-hlo-op", "other"),
    ],
)
def test_category_tables(vocabulary: Vocabulary, op: str, category: str) -> None:
    assert categorize(vocabulary, op) == category


def test_every_table_uses_only_the_common_categories() -> None:
    for table in TABLES.values():
        assert {category for _, category in table} <= set(CATEGORIES) - {"other"}


def _chrome_trace(path: Path, events: list[dict[str, object]], gz: bool = False) -> Path:
    data = json.dumps({"traceEvents": events}).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def test_torch_rule_keeps_ops_and_drops_annotations(tmp_path: Path) -> None:
    events: list[dict[str, object]] = [
        {"ph": "X", "cat": "user_annotation", "name": "fwbench.call", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
        {"ph": "X", "cat": "cpu_op", "name": "aten::linear", "pid": 1, "tid": 1, "ts": 10, "dur": 50},
        {"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "pid": 1, "tid": 1, "ts": 15, "dur": 40},
        {"ph": "X", "cat": "python_function", "name": "forward", "pid": 1, "tid": 1, "ts": 5, "dur": 90},
        {"ph": "i", "cat": "cpu_op", "name": "instant", "pid": 1, "tid": 1, "ts": 20},
    ]
    trace = read_chrome_trace(_chrome_trace(tmp_path / "t.json.gz", events, gz=True))
    ops = op_events(trace, OP_RULES["torch"])
    assert [(op.name, op.start_s, op.duration_s) for op in ops] == [
        ("aten::linear", pytest.approx(10 * US), pytest.approx(50 * US)),
        ("aten::addmm", pytest.approx(15 * US), pytest.approx(40 * US)),
    ]
    summary = summarize(ops, calls=1, wall_s=100 * US)
    assert summary.busy_s == pytest.approx(50 * US) and summary.overhead_s == pytest.approx(50 * US)
    assert summary.categories_s["matmul/conv"] == pytest.approx(50 * US)  # linear's 10 µs self + addmm's 40


def test_xla_thunks_are_ops_by_their_hlo_op_argument(tmp_path: Path) -> None:
    """JAX's trace (and TensorFlow's XLA clusters): thunks carry args.hlo_op and no category; their end markers
    and the Python frames are not ops. A TensorFlow trace holds executor ops (tf_op) and thunks: two vocabularies."""
    events: list[dict[str, object]] = [
        {"ph": "X", "name": "fusion.1", "pid": 7, "tid": 2, "ts": 0, "dur": 5, "args": {"hlo_op": "fusion.1"}},
        {"ph": "X", "name": "end: fusion.1", "pid": 7, "tid": 2, "ts": 5, "dur": 0.3, "args": {"_src": "x"}},
        {"ph": "X", "name": "PjitFunction(f)", "pid": 7, "tid": 3, "ts": 0, "dur": 9},
        {"ph": "X", "cat": "tf_op", "name": "_MklSoftmax", "pid": 7, "tid": 4, "ts": 9, "dur": 2},
    ]
    trace = read_chrome_trace(_chrome_trace(tmp_path / "x.json", events))
    assert [(op.name, op.vocabulary) for op in op_events(trace, OP_RULES["jax"])] == [("fusion.1", "xla")]
    assert [(op.name, op.vocabulary) for op in op_events(trace, OP_RULES["tensorflow"])] == [
        ("fusion.1", "xla"),
        ("_MklSoftmax", "tensorflow"),
    ]
    summary = summarize(op_events(trace, OP_RULES["tensorflow"]), calls=1, wall_s=20 * US)
    assert summary.categories_s["compiled fusion"] == pytest.approx(5 * US)
    assert summary.categories_s["attention/softmax"] == pytest.approx(2 * US)


def test_a_file_that_is_not_a_chrome_trace_is_refused(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text('{"x": 1}')
    with pytest.raises(ValueError, match="not a Chrome trace"):
        read_chrome_trace(tmp_path / "bad.json")

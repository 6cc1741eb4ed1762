"""``details.kernels``: which kernel libraries ran an inference cell's heavy ops, and on which ISA, as the libraries
report it (fwbench.frameworks.kernel_reports; each framework's kernels.py). The parsers on literal lines; then real
cells, checked for structure only: which library and ISA a CPU gets is the CPU's affair (AVX2, AVX-512, AMX …)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from conftest import NEED_EXTRAS_ENV, fwbench_here, run_args
from fwbench.frameworks.kernel_reports import (
    captured_stdout,
    is_isa,
    kernel_entry,
    parse_hlo,
    parse_mkl,
    parse_onednn,
    parse_openvino,
    parse_openvino_primitive,
    probe_failure,
)
from fwbench.frameworks.tfjs import external
from fwbench.messages import STAGES

ONEDNN = """\
onednn_verbose,v1,info,oneDNN v3.12.0 (commit 80afa71049cd69a3df32adcccb623b12cd7baa22)
onednn_verbose,v1,info,cpu,runtime:OpenMP,nthr:1
onednn_verbose,v1,info,cpu,isa:Intel AVX-512 with Intel DL Boost and bfloat16 support
onednn_verbose,v1,primitive,info,template:operation,engine,primitive,implementation,prop_kind,memory_descriptors,attributes,auxiliary,problem_desc,exec_time
onednn_verbose,v1,primitive,exec,cpu,reorder,jit:blk,undef,src:f32::blocked:abcd::f0 dst:f32::blocked:aBcd16b::f0,attr-scratchpad:user,,4x16x32x32,0.0241699
onednn_verbose,v1,primitive,exec,cpu,convolution,jit:avx512_core,forward_training,src:f32:a:blocked:aBcd16b::f0 wei:f32:a:blocked:ABcd16b16a::f0,attr-scratchpad:user,alg:convolution_direct,mb4_ic16oc32_ih32oh30kh3sh1dh0ph0_iw32ow30kw3sw1dw0pw0,0.291016
onednn_verbose,v1,primitive,exec,cpu,matmul,brg_matmul:avx512_core,undef,src:f32::blocked:ab::f0,,,2x64:64x64,0.01
onednn_verbose,v1,primitive,exec,cpu,inner_product,x64:gemm:jit,forward_inference,src:f32::blocked:ab::f0,,,mb2ic64oc64,0.02
some other line the program printed
"""  # noqa: E501 (literal lines, as the libraries print them)

MKL = """\
MKL_VERBOSE oneMKL 2024.0 Update 2 Product build 20240605 for Intel(R) 64 architecture Intel(R) Architecture processors, Lnx 2.60GHz lp64 gnu_thread
MKL_VERBOSE SGEMM(T,N,64,8,64,0x7ffe00956880,0x558db0f52400,64,0x558dabc63ec0,64,0x7ffe009568a0,0x558db0f57480,64) 37.26us CNR:OFF Dyn:0 FastMM:1 TID:0  NThr:1
MKL_VERBOSE SGEMM_BATCH(N,N,0x7ffe009573c8,0x7ffe009573c4,0x7ffe009573c0,0x7ffe009573bc,0x7ffe009574a0,0x7ffe009573f8,0x7ffe00957530,0x7ffe00957408,0x7ffe009573b8,0x7ffe009575c0,0x7ffe00957418,0x7ffe00956ac4,0x7ffe009573cc) 24.05us CNR:OFF Dyn:0 FastMM:1 TID:0  NThr:1
"""  # noqa: E501 (literal lines, as the libraries print them)

MKL_AVX512 = (
    "MKL_VERBOSE oneMKL 2024.0 Product build 20231011 for Intel(R) 64 architecture Intel(R) Advanced Vector "
    "Extensions 512 (Intel(R) AVX-512) enabled processors, Lnx 2.10GHz lp64 intel_thread\n"
    "MKL_VERBOSE SGEMM(N,N,64,8,64,0x1,0x2,64,0x3,64,0x4,0x5,64) 10.1us CNR:OFF Dyn:1 FastMM:1 TID:0  NThr:4\n"
)

HLO = """\
HloModule jit__lambda, is_scheduled=true, entry_computation_layout={(f32[64,64]{1,0}, f32[8,64]{1,0})->f32[8,64]{1,0}}
%fused_computation (param_0: f32[8,64], param_1: f32[64,64]) -> f32[8,64] {
  %param_0 = f32[8,64]{1,0} parameter(0)
  %param_1 = f32[64,64]{1,0} parameter(1)
  ROOT %dot_general.0 = f32[8,64]{1,0} dot(%param_0, %param_1), lhs_contracting_dims={1}, rhs_contracting_dims={1}
}
%wrapped_tanh_computation (param_0.2: f32[8,64]) -> f32[8,64] {
  %param_0.2 = f32[8,64]{1,0} parameter(0)
  ROOT %tanh.0 = f32[8,64]{1,0} tanh(%param_0.2)
}
ENTRY %main.1 (w.1: f32[64,64], x.1: f32[8,64]) -> f32[8,64] {
  %w.1 = f32[64,64]{1,0} parameter(0), metadata={op_name="w"}
  %x.1 = f32[8,64]{1,0} parameter(1), metadata={op_name="x"}
  %conv = f32[1,8,8,4]{3,2,1,0} convolution(%a, %b), window={size=3x3}, dim_labels=b01f_01io->b01f
  %wrapped_tanh = f32[8,64]{1,0} fusion(%x.1), kind=kLoop, calls=%wrapped_tanh_computation
  ROOT %ynn_fusion = f32[8,64]{1,0} fusion(%wrapped_tanh, %w.1), kind=kCustom, calls=%fused_computation, backend_config={"fusion_config":{"kind":"__ynn_fusion"},"outer_dimension_partitions":[]}
}
"""  # noqa: E501 (literal lines, as the libraries print them)

TF_XLA_HLO = """\
ENTRY %a_inference_f_21__.5 (arg0.1: f32[8,64], arg1.1: f32[64,64]) -> f32[8,64] {
  %matmul.2 = f32[8,64]{1,0} dot(%arg0.1, %arg1.1), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_type="MatMul" op_name="matmul"}
  ROOT %wrapped_tanh = f32[8,64]{1,0} fusion(%matmul.2), kind=kLoop, calls=%wrapped_tanh_computation, metadata={op_type="Tanh" op_name="Tanh"}
}
"""


def by_library(entries: list[dict[str, Any]]) -> dict[str | None, dict[str, Any]]:
    return {entry["library"]: entry for entry in entries}


def test_onednn_lines_give_one_entry_per_isa_with_version_and_the_most_it_may_use() -> None:
    entries = parse_onednn(ONEDNN)
    by_isa = {entry["isa"]: entry for entry in entries}
    assert set(by_isa) == {"avx512_core", None}
    jit = by_isa["avx512_core"]
    assert jit["library"] == "oneDNN" and jit["version"] == "3.12.0" and jit["source"] == "oneDNN verbose"
    assert jit["ops"] == ["convolution", "matmul"]  # the reorder moves data: left out
    assert jit["implementations"] == ["brg_matmul:avx512_core", "jit:avx512_core"]
    assert jit["max_isa"] == "Intel AVX-512 with Intel DL Boost and bfloat16 support"
    assert "not_reported" not in jit
    gemm = by_isa[None]
    assert gemm["ops"] == ["inner_product"] and "x64:gemm:jit" in gemm["not_reported"]


def test_onednn_without_its_info_lines_says_why_the_version_is_missing() -> None:
    exec_only = "\n".join(line for line in ONEDNN.splitlines() if ",exec," in line)
    (entry,) = [e for e in parse_onednn(exec_only) if e["isa"] == "avx512_core"]
    assert entry["version"] is None and "version" in entry["not_reported"]
    assert parse_onednn("nothing\nonednn_verbose,v1,info,cpu,isa:AVX2\n") == []  # no compute primitive ran


def test_mkl_lines_give_the_version_the_code_path_and_the_functions() -> None:
    (entry,) = parse_mkl(MKL)
    assert entry == {
        "library": "oneMKL",
        "version": "2024.0 Update 2",
        "isa": "Intel(R) Architecture processors",
        "ops": ["SGEMM", "SGEMM_BATCH"],
        "source": "MKL_VERBOSE",
    }
    (avx512,) = parse_mkl(MKL_AVX512)
    assert avx512["isa"] == "Intel(R) Advanced Vector Extensions 512 (Intel(R) AVX-512) enabled processors"
    assert avx512["version"] == "2024.0"
    assert parse_mkl(MKL.splitlines()[0]) == []  # a header, no call
    (headless,) = parse_mkl("\n".join(MKL.splitlines()[1:]))
    assert headless["isa"] is None and headless["not_reported"]


def test_hlo_text_names_ynnpack_for_its_custom_fusions_and_xla_for_the_rest() -> None:
    entries = by_library(parse_hlo(HLO, "0.10.2"))
    assert set(entries) == {"YNNPACK", "XLA:CPU"}
    assert entries["YNNPACK"]["ops"] == ["matmul"]
    assert entries["XLA:CPU"]["ops"] == ["convolution"]
    for entry in entries.values():
        assert entry["isa"] is None and "ISA" in entry["not_reported"]
        assert entry["version"] == "0.10.2" and entry["source"] == "compiled HLO"
    (tf_xla,) = parse_hlo(TF_XLA_HLO, "2.21.0")
    assert tf_xla["library"] == "XLA:CPU" and tf_xla["ops"] == ["matmul"]
    assert parse_hlo("HloModule empty\n", None) == []


def test_openvino_primitive_types_split_into_library_isa_and_implementation() -> None:
    assert parse_openvino_primitive("brgconv_avx512_f32") == ("OpenVINO CPU plugin", "avx512", "brgconv")
    assert parse_openvino_primitive("brgconv_avx512_1x1_f32") == ("OpenVINO CPU plugin", "avx512", "brgconv_1x1")
    assert parse_openvino_primitive("jit_avx512_amx_bf16") == ("OpenVINO CPU plugin", "avx512_amx", "jit")
    assert parse_openvino_primitive("jit_avx2_f32") == ("OpenVINO CPU plugin", "avx2", "jit")
    assert parse_openvino_primitive("gemm_mlas_f32") == ("MLAS", None, "gemm_mlas")
    assert parse_openvino_primitive("ref_any_f32") == ("OpenVINO CPU plugin", None, "ref_any")
    assert parse_openvino_primitive("unknown_f32") is None
    entries = parse_openvino(
        [
            ("Input", "unknown_f32"),
            ("FullyConnected", "gemm_mlas_f32"),
            ("FullyConnected", "brgconv_avx512_1x1_f32"),
            ("MatMul", "brgemm_avx512_f32"),
            ("Gather", "ref_any_f32"),
        ],
        "2026.4.1",
        "OpenVINO runtime model rt_info primitiveType",
    )
    groups = {(e["library"], e["isa"]): e for e in entries}
    assert set(groups) == {("MLAS", None), ("OpenVINO CPU plugin", "avx512"), ("OpenVINO CPU plugin", None)}
    assert groups["OpenVINO CPU plugin", "avx512"]["ops"] == ["FullyConnected", "MatMul"]
    assert groups["MLAS", None]["not_reported"] and groups["OpenVINO CPU plugin", None]["not_reported"]


def test_isa_tokens_and_entries_without_an_isa_must_say_why() -> None:
    assert all(is_isa(token) for token in ("avx2", "avx512_core", "avx512_core_amx", "sse41", "amx", "avx10_1"))
    assert not any(is_isa(token) for token in ("uni", "any", "jit", "blk", "ref", "mlas", "1x1"))
    with pytest.raises(ValueError, match="not_reported"):
        kernel_entry("X", version="1", isa=None, ops=(), source="s")
    (failed,) = probe_failure(RuntimeError("boom"))
    assert failed["library"] is None and failed["not_reported"] == "the probe failed: RuntimeError: boom"


def test_captured_stdout_takes_what_is_written_to_fd_1_and_restores_it() -> None:
    before = os.fstat(1)
    with captured_stdout() as captured:
        os.write(1, b"onednn_verbose,from the descriptor\n")
        os.system("echo from a child process")  # noqa: S605, S607 (a process writing to the inherited fd 1)
    assert "onednn_verbose,from the descriptor" in captured.text
    assert "from a child process" in captured.text
    after = os.fstat(1)
    assert (before.st_dev, before.st_ino) == (after.st_dev, after.st_ino)
    with pytest.raises(KeyError), captured_stdout() as failing:
        os.write(1, b"kept\n")
        raise KeyError("x")
    assert failing.text == "kept\n" and os.fstat(1).st_ino == before.st_ino
    assert "kernels" in STAGES


# -- real cells -------------------------------------------------------------------------------------------------
# make test: one runtime of each framework; the matrix (make test-matrix): each engine and Keras. The engines' cells
# are also bert-tiny's parity through every exporter (tests/test_deploy.py checks gpt2-tiny's and resnet-tiny's).
CELLS = {
    "frameworks": ("torch:eager", "tensorflow:function", "jax:jit"),
    "engines": ("onnxruntime:torch", "onnxruntime:tensorflow", "openvino:torch", "litert:tensorflow", "keras:torch"),
}


def check_structure(runtime: str, kernels: Any) -> None:
    """Structure only: a non-empty list; each entry names its library and source (or says why not), an ISA or a
    version left out says why."""
    assert isinstance(kernels, list) and kernels, f"{runtime}: {kernels}"
    for entry in kernels:
        assert {"library", "version", "isa", "ops", "source"} <= set(entry), f"{runtime}: {entry}"
        assert isinstance(entry["ops"], list)
        if entry["isa"] is None or entry["version"] is None or entry["library"] is None:
            assert isinstance(entry.get("not_reported"), str) and entry["not_reported"], f"{runtime}: {entry}"
        if entry["library"] is not None:
            assert entry["source"], f"{runtime}: {entry}"
    assert all(entry["library"] is not None for entry in kernels), f"{runtime}: the probe failed: {kernels}"


def check_libraries(runtime: str, kernels: list[dict[str, Any]]) -> None:
    """What each framework's probe must name, whatever the CPU."""
    libraries = {entry["library"] for entry in kernels}
    sources = {entry["source"] for entry in kernels}
    if runtime in ("torch:eager", "keras:torch"):
        # ATen always; oneMKL or oneDNN only as their verbose text said (a matmul goes to one of them)
        assert "ATen" in libraries and libraries & {"oneMKL", "oneDNN"}, kernels
        assert all(
            e["source"] in ("MKL_VERBOSE", "oneDNN verbose", "torch.backends.cpu.get_cpu_capability()") for e in kernels
        )
        aten = next(e for e in kernels if e["library"] == "ATen")
        assert aten["isa"], aten  # torch.backends.cpu.get_cpu_capability() always answers
    elif runtime == "tensorflow:function":
        assert "Eigen" in libraries, kernels
    elif runtime == "jax:jit":
        assert sources == {"compiled HLO"} and libraries & {"YNNPACK", "XLA:CPU", "XNNPACK", "oneDNN"}, kernels
    elif runtime.startswith("onnxruntime:"):
        assert libraries == {"MLAS"}, kernels
    elif runtime == "openvino:torch":
        assert sources == {"OpenVINO runtime model rt_info primitiveType"}, kernels
    elif runtime == "litert:tensorflow":
        assert "XNNPACK" in libraries, kernels
    elif runtime == "tfjs:wasm":
        (entry,) = kernels
        assert entry["library"] == "TF.js wasm (XNNPACK)" and entry["isa"].startswith("WebAssembly"), entry
        assert "MatMul" in entry["ops"] or "BatchMatMul" in entry["ops"] or "_FusedMatMul" in entry["ops"], entry


def stored_kernels(db_path: Path) -> dict[str, Any]:
    from fwbench.store.db import Store

    with Store.open(db_path) as store:
        rows = list(store.results())
    assert all(row.status == "ok" for row in rows), [
        (row.runtime, row.status, row.details.get("reason")) for row in rows
    ]
    return {row.runtime: row.details.get("kernels") for row in rows}


def run_cells(runtimes: tuple[str, ...], db_path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """bert-tiny at batch 2, sequence 8, one round in each of ``runtimes``: the stored ``details.kernels`` by runtime."""
    args = run_args(
        *("--models", "bert-tiny", "--runtimes", ",".join(runtimes), "--batch-sizes", "2", "--seq-lens", "8"),
        db=db_path,
        max_time=0.2,
    )
    code, _, err = fwbench_here(capsys, *args)
    assert code == 0, err[-3000:]
    return stored_kernels(db_path)


@pytest.mark.slow
@pytest.mark.parametrize("group", ["frameworks", pytest.param("engines", marks=pytest.mark.matrix)])
def test_each_framework_and_engine_records_its_kernel_libraries(
    db_path: Path, capsys: pytest.CaptureFixture[str], group: str
) -> None:
    """One cell of each framework and engine: details.kernels is there, well formed, and names what its framework's
    probe reads (never an ISA fixed here: that is the CPU's)."""
    kernels = run_cells(CELLS[group], db_path, capsys)
    assert sorted(kernels) == sorted(CELLS[group])
    for runtime, entries in kernels.items():
        check_structure(runtime, entries)
        check_libraries(runtime, entries)


@pytest.mark.slow
def test_tfjs_wasm_records_its_backend_and_the_kernels_it_ran(
    db_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The JavaScript worker's probe (kernels.mjs): the wasm backend's SIMD report and the kernels tf.profile saw."""
    missing = external.missing()
    if missing and os.environ.get(NEED_EXTRAS_ENV) == "all":
        pytest.fail(f"the tfjs runtimes cannot run, but ${NEED_EXTRAS_ENV}=all: {missing}")
    if missing:
        pytest.skip(missing)
    kernels = run_cells(("tfjs:wasm",), db_path, capsys)
    check_structure("tfjs:wasm", kernels["tfjs:wasm"])
    check_libraries("tfjs:wasm", kernels["tfjs:wasm"])


def test_torch_reports_atens_and_inductors_isa_from_torch_itself() -> None:
    """torch:compile and torch:export add inductor's pick (its generated C++), every torch cell ATen's capability:
    whatever this CPU gives, each is named with its source, or says why not."""
    pytest.importorskip("torch")
    from fwbench.frameworks.torch.kernels import aten_entry, inductor_entry

    aten, inductor = aten_entry(), inductor_entry()
    assert aten["library"] == "ATen" and aten["isa"] and aten["source"] == "torch.backends.cpu.get_cpu_capability()"
    assert inductor["source"] == "torch._inductor.cpu_vec_isa.pick_vec_isa()"
    assert inductor["isa"] or inductor["not_reported"]

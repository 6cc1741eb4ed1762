"""The environment record stored with every run: flat, JSON-serialisable, schema-versioned.

Framework versions come from installed package metadata, so no framework is imported here.
"""

from __future__ import annotations

import os
import platform
import socket
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

ENV_SCHEMA_VERSION = 1
TRACKED_PACKAGES = (
    "fwbench",
    "numpy",
    "scipy",
    "torch",
    "tensorflow",
    "tensorflow-cpu",
    "jax",
    "jaxlib",
    "keras",
    "onnxruntime",
    "onnx",
    "openvino",
    "ai-edge-litert",
    "tf2onnx",
)
TRACKED_ENV_VARS = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "OPENBLAS_CORETYPE",
    "TF_NUM_INTRAOP_THREADS",
    "TF_NUM_INTEROP_THREADS",
    "XLA_FLAGS",
    "CUDA_VISIBLE_DEVICES",
    "TF_ENABLE_ONEDNN_OPTS",  # TensorFlow's oneDNN kernels on/off (default: on only with VNNI, AVX512_BF16, AMX)
    "ONEDNN_MAX_CPU_ISA",  # caps on the kernels' instruction set (oneDNN in torch and TF, ATen)
    "ATEN_CPU_CAPABILITY",
)
SIMD_FLAGS = (
    "sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16", "amx_int8",
    "amx_tile",
)  # fmt: skip
BF16_UNITS = ("avx512_bf16", "amx_bf16")  # CPU flags of native bfloat16 arithmetic (without them it is emulated)


def cpu_bf16_units() -> list[str]:
    """This CPU's native bfloat16 units among BF16_UNITS (empty: bfloat16 is emulated in float32 arithmetic)."""
    flags = cpu_simd_flags()
    return [flag for flag in BF16_UNITS if flag in flags]


def cpu_simd_flags() -> set[str]:
    """This CPU's flags among SIMD_FLAGS (from /proc/cpuinfo; empty where it cannot be read)."""
    return set(filter(None, _cpu_info()["cpu_simd_flags"].split(",")))


def physical_core_count() -> int:
    """Physical cores available to this process (hyper-threads counted once)."""
    return len({_cpu_topology_key(cpu) for cpu in os.sched_getaffinity(0)})


def _cpu_topology_key(cpu: int) -> tuple[int, int]:
    """(package id, core id) of a logical CPU from sysfs; the CPU itself where sysfs has no topology."""
    base = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
    try:
        return int((base / "physical_package_id").read_text()), int((base / "core_id").read_text())
    except (OSError, ValueError):
        return 0, cpu


def cpus_one_per_core() -> list[int]:
    """The CPUs this process may use, ordered so that the first ones sit on distinct physical cores.

    Pinning N threads to the first N of this list gives each its own core before any two share one.
    """
    firsts: list[int] = []
    siblings: list[int] = []
    seen: set[tuple[int, int]] = set()
    for cpu in sorted(os.sched_getaffinity(0)):
        key = _cpu_topology_key(cpu)
        (siblings if key in seen else firsts).append(cpu)
        seen.add(key)
    return firsts + siblings


def thread_affinities() -> list[str]:
    """The distinct CPU lists (``Cpus_allowed_list``) of this process's threads, e.g. ``['0']``."""
    lists: set[str] = set()
    for task in Path("/proc/self/task").iterdir():
        try:
            for line in (task / "status").read_text().splitlines():
                if line.startswith("Cpus_allowed_list:"):
                    lists.add(line.split(":", 1)[1].strip())
        except OSError:  # the thread ended meanwhile
            continue
    return sorted(lists)


def _cpu_info() -> dict[str, Any]:
    model, flags = platform.processor() or "unknown", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name":
                model = value.strip()
            elif key == "flags":
                flags = set(value.split())
                break
    except OSError:
        pass
    return {"cpu_model": model, "cpu_simd_flags": ",".join(f for f in SIMD_FLAGS if f in flags)}


def _memory_total_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def package_versions() -> dict[str, str | None]:
    """Installed version of each tracked package, None where absent."""
    versions: dict[str, str | None] = {}
    for name in TRACKED_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def collect() -> dict[str, Any]:
    """The environment record of this machine and interpreter, as flat keys."""
    record: dict[str, Any] = {
        "env_schema_version": ENV_SCHEMA_VERSION,
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "logical_cpus": os.cpu_count(),
        "affinity_cpus": len(os.sched_getaffinity(0)),
        "physical_cores": physical_core_count(),
        "memory_total_bytes": _memory_total_bytes(),
        **_cpu_info(),
    }
    for name, version in package_versions().items():
        record[f"version_{name}"] = version
    for var in TRACKED_ENV_VARS:
        record[f"env_{var}"] = os.environ.get(var)
    return record


def machine_record() -> dict[str, Any]:
    """The machine a result was measured on (stored with every result): host, CPU model and SIMD flags, CPUs,
    cores and memory."""
    return {
        "hostname": socket.gethostname(),
        "machine": platform.machine(),
        "logical_cpus": os.cpu_count(),
        "physical_cores": physical_core_count(),
        "memory_total_bytes": _memory_total_bytes(),
        **_cpu_info(),
    }


def memory_available_bytes() -> int | None:
    """MemAvailable of /proc/meminfo: what new processes can use without swapping, bytes; None if unreadable."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None

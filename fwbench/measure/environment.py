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
    "fwbench", "numpy", "scipy", "torch", "tensorflow", "tensorflow-cpu", "jax", "jaxlib", "keras",
    "onnxruntime",
)
TRACKED_ENV_VARS = (
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE",
    "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS", "XLA_FLAGS", "CUDA_VISIBLE_DEVICES",
)
SIMD_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_tile")


def physical_core_count() -> int:
    """Physical cores available to this process (hyper-threads counted once)."""
    allowed = os.sched_getaffinity(0)
    cores: set[tuple[str, str]] = set()
    current: dict[str, str] = {}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return len(allowed)
    for block in text.strip().split("\n\n"):
        current = {}
        for line in block.splitlines():
            key, _, value = line.partition(":")
            current[key.strip()] = value.strip()
        if "processor" in current and int(current["processor"]) in allowed:
            cores.add((current.get("physical id", "0"), current.get("core id", current["processor"])))
    return max(1, len(cores)) if cores else len(allowed)


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

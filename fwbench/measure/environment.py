"""The environment record stored with every run: flat, JSON-serialisable, schema-versioned.

Framework versions come from installed package metadata, so no framework is imported here.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
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
INT8_UNITS = ("avx512_vnni", "avx_vnni", "amx_int8")  # CPU flags of int8 dot-product instructions (VNNI, AMX)
BF16_UNITS = ("avx512_bf16", "amx_bf16")  # CPU flags of native bfloat16 arithmetic (without them it is emulated)


def cpu_int8_units() -> list[str]:
    """This CPU's int8 dot-product units among INT8_UNITS (empty: int8 multiply-adds go through AVX2's vpmaddubsw)."""
    flags = cpu_simd_flags()
    return [flag for flag in INT8_UNITS if flag in flags]


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


def cpu_list_set(text: str) -> set[int]:
    """The CPUs of a kernel CPU list (``Cpus_allowed_list``: "0-1,4")."""
    cpus: set[int] = set()
    for part in filter(None, text.strip().split(",")):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def pin_every_thread(cpus: Sequence[int]) -> None:
    """Pin every thread of this process to ``cpus`` (``os.sched_setaffinity(0, ...)`` moves the calling thread
    only); threads started meanwhile by a thread not yet pinned are caught by another pass."""
    wanted = set(cpus)
    for _ in range(10):
        moved = False
        for task in Path("/proc/self/task").iterdir():
            try:
                if os.sched_getaffinity(int(task.name)) != wanted:
                    os.sched_setaffinity(int(task.name), wanted)
                    moved = True
            except (ProcessLookupError, FileNotFoundError):  # the thread ended meanwhile
                continue
        if not moved:
            return
    raise RuntimeError(f"threads kept appearing outside CPUs {sorted(wanted)}")


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


def _machine_physical_cores() -> int:
    """Physical cores of the whole machine (every online CPU, whatever this process's affinity)."""
    return len({_cpu_topology_key(cpu) for cpu in range(os.cpu_count() or 1)})


@functools.lru_cache(maxsize=1)
def accelerators() -> tuple[str, ...]:
    """The machine's accelerators as ``name (memory)`` (NVIDIA GPUs, from ``nvidia-smi``; no framework is
    imported); empty without one or without the tool."""
    tool = shutil.which("nvidia-smi")
    if tool is None:
        return ()
    try:
        done = subprocess.run(
            [tool, "--query-gpu=name,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ()
    if done.returncode != 0:
        return ()
    return tuple(
        " (".join(part.strip() for part in line.split(",", 1)) + ")"
        for line in done.stdout.splitlines()
        if line.strip()
    )


def hardware_record(flat: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The hardware a result ran on, without software or host name: architecture, CPU model and SIMD flags,
    logical CPUs of the whole machine, memory in whole GiB (rounded, so two machines of one type agree),
    accelerators. From ``flat`` (a machine record stored before fingerprints: flat keys, no accelerators) when
    given, else this machine's. The hashed fields mean the same in both; what they lacked (the accelerators) reads
    as none, so a GPU machine's rows from before fingerprints get an id of their own."""
    if flat is None:  # this machine's, in the same flat keys
        flat = {
            "machine": platform.machine(),
            **_cpu_info(),
            "logical_cpus": os.cpu_count(),
            "memory_total_bytes": _memory_total_bytes(),
            "accelerators": list(accelerators()),
        }
    memory = flat.get("memory_total_bytes")
    return {
        "machine": flat.get("machine"),
        "cpu_model": flat.get("cpu_model"),
        "cpu_simd_flags": flat.get("cpu_simd_flags"),
        "logical_cpus": flat.get("logical_cpus"),
        "memory_gib": None if memory is None else round(int(memory) / 2**30),
        "accelerators": list(flat.get("accelerators") or []),
    }


def software_record() -> dict[str, Any]:
    """The software a result ran with: Python, the operating system and every tracked package's version."""
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        **{f"version_{name}": version for name, version in package_versions().items()},
    }


def record_id(record: Mapping[str, Any]) -> str:
    """A record's identity: the first 16 hex digits of the SHA-256 of its sorted JSON."""
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:16]


def machine_record() -> dict[str, Any]:
    """The machine a result was measured on (stored with every result): the host name, the hardware fingerprint
    (:func:`hardware_record` and its :func:`record_id`) kept apart from the software record and its id, and the
    CPUs and memory this process may use."""
    hardware, software = hardware_record(), software_record()
    return {
        "hostname": socket.gethostname(),
        "hardware": hardware,
        "hardware_id": record_id(hardware),
        "software": software,
        "software_id": record_id(software),
        "physical_cores": _machine_physical_cores(),
        "affinity_cpus": len(os.sched_getaffinity(0)),
        "memory_total_bytes": _memory_total_bytes(),
    }


def machine_ids(machine: Mapping[str, Any] | None) -> tuple[str | None, str | None, str | None]:
    """(host name, hardware id, software id) of a stored machine record; a record stored before fingerprints
    (flat hardware keys, no software) gets the hardware id its keys give and no software id."""
    if not machine:
        return None, None, None
    hostname = machine.get("hostname")
    if "hardware_id" in machine:
        return hostname, machine.get("hardware_id"), machine.get("software_id")
    return hostname, record_id(hardware_record(machine)), None


def hardware_label(machine: Mapping[str, Any] | None) -> str:
    """A short name of a stored machine's hardware: ``<cpu model>, <N> cores, <M> GiB [+ accelerators]``."""
    if not machine:
        return "unknown machine"
    hardware = machine.get("hardware") or hardware_record(machine)
    text = f"{hardware.get('cpu_model')}, {hardware.get('logical_cpus')} CPUs, {hardware.get('memory_gib')} GiB"
    if hardware.get("accelerators"):
        text += " + " + ", ".join(hardware["accelerators"])
    return text


def memory_available_bytes() -> int | None:
    """MemAvailable of /proc/meminfo: what new processes can use without swapping, bytes; None if unreadable."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None

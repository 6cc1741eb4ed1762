"""The Python side of the TensorFlow.js worker: whether it can run here (:func:`missing`, :func:`missing_model`) and
what it reads (:func:`prepare`), written by the cell's Python worker before that process becomes ``node
worker.mjs`` (fwbench.runner.external). Numpy and safetensors only: no framework is imported.

What :func:`prepare` writes into the cell's folder (removed by the JavaScript worker when it ends):

- ``cell.json``: the job as the manager sent it (``job``), the model's name, architecture and structure (``model``:
  what its ``<arch>.mjs`` builds from), its input and output names, the parity tolerance and shape, and the paths
  below;
- the weights (the job's ``weights_path``, else ``weights.safetensors``: the seeded canonical set), float32, in the
  canonical names and layouts (torch's: linear weights (out, in), convolutions (out, in, kh, kw));
- ``inputs.safetensors``: the inputs at the cell's shape (int32 token ids, float32 pixels, channels first);
- ``parity.safetensors``: the inputs at the model's parity shape (``input/<name>``) and the float64 reference
  outputs on them (``reference/<name>``), which ``python -m fwbench.runner.external compare`` checks the worker's
  outputs and checkpoints against.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file

from fwbench.models import get_model
from fwbench.models.base import ModelDescription
from fwbench.models.weights_io import load_weights
from fwbench.runner.messages import Job
from fwbench.runner.tolerances import parity_tolerance

PACKAGE_DIR = Path(__file__).resolve().parent
WORKER_SCRIPT = PACKAGE_DIR / "worker.mjs"
NODE_PACKAGES = ("@tensorflow/tfjs-core", "@tensorflow/tfjs-backend-cpu", "@tensorflow/tfjs-backend-wasm")
MIN_NODE_MAJOR = 18  # the oldest Node.js the packages and the worker's syntax are tested on (this machine: 20)
NODE_ENV = "FWBENCH_NODE"  # the Node.js executable to run (default: node on PATH)
MODELS_ENV = "FWBENCH_TFJS_MODELS"  # a folder of <arch>.mjs files used instead of this package's (model development)
INSTALL_HINT = "make install (it runs scripts/ensure-node-packages)"


def node_executable() -> str | None:
    """The Node.js executable: ``$FWBENCH_NODE``, else ``node`` on PATH; None when there is none."""
    return shutil.which(os.environ.get(NODE_ENV) or "node")


@functools.cache
def node_version(executable: str) -> tuple[int, ...] | None:
    """``executable``'s version (``node --version``), None when it does not answer like Node.js."""
    try:
        answer = subprocess.run([executable, "--version"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.fullmatch(r"v(\d+)\.(\d+)\.(\d+)\s*", answer)
    return tuple(int(part) for part in found.groups()) if found else None


def missing() -> str | None:
    """None when the tfjs runtimes can run here, else why not (Node.js absent or too old, packages not installed)."""
    executable = node_executable()
    if executable is None:
        return f"Node.js is not installed (no node on PATH): install Node.js {MIN_NODE_MAJOR} or later, then {INSTALL_HINT}"
    version = node_version(executable)
    if version is None or version[0] < MIN_NODE_MAJOR:
        found = "an unreadable version" if version is None else "v" + ".".join(map(str, version))
        return f"{executable} is {found}; the tfjs runtimes need Node.js {MIN_NODE_MAJOR} or later"
    for package in NODE_PACKAGES:
        if not (PACKAGE_DIR / "node_modules" / package / "package.json").is_file():
            return f"{package} is not installed in {PACKAGE_DIR / 'node_modules'} ({INSTALL_HINT})"
    return None


def models_dir() -> Path:
    """The folder of the ``<arch>.mjs`` model files: ``$FWBENCH_TFJS_MODELS``, else this package."""
    override = os.environ.get(MODELS_ENV)
    return Path(override).resolve() if override else PACKAGE_DIR


def missing_model(arch: str) -> str | None:
    """None when ``<arch>.mjs`` exists, else why the runtime cannot build ``arch``."""
    return None if (models_dir() / f"{arch}.mjs").is_file() else f"no tfjs implementation of {arch} yet"


def model_structure(description: ModelDescription) -> dict[str, Any]:
    """What ``<arch>.mjs`` builds the model from: its sizes and the canonical names of its tensors."""
    arch = description.arch
    if arch == "mlp":
        return {"layers": [list(layer) for layer in description.layers]}  # type: ignore[attr-defined]
    if arch == "bert":
        from fwbench.models.bert import LAYER_ROLES, Bert

        assert isinstance(description, Bert)
        config = description.config
        names = {
            role: [[description.param(role, i, kind) for kind in ("weight", "bias")] for i in range(config.layers)]
            for role in LAYER_ROLES
        }
        globals_ = ["word_embeddings", "position_embeddings", "embeddings_norm"]
        globals_ += ["token_type_embeddings", "pooler"] if description.has_token_types else []
        kinds = ("attention", "ffn", "layer")
        return {
            "config": dataclasses.asdict(config),
            "checkpoints": [[description.checkpoint(kind, i) for kind in kinds] for i in range(config.layers)],
            "token_types": description.has_token_types,
            "pooler": description.has_pooler,
            "layers": names,
            "globals": {role: [description.param(role, kind=kind) for kind in ("weight", "bias")] for role in globals_},
        }
    if arch == "resnet":
        from fwbench.models.resnet import ResNet

        assert isinstance(description, ResNet)
        return {
            "stem": dataclasses.asdict(description.stem),
            "blocks": [dataclasses.asdict(block) for block in description.blocks],
            "eps": description.config.bn_eps,
        }
    raise NotImplementedError(f"the tfjs worker has no structure for {arch} models")


def prepare(job: Job, folder: Path) -> list[str]:
    """Write what the JavaScript worker of ``job`` reads into ``folder`` (module docstring); returns the command
    line that starts it (the worker adds its protocol's arguments)."""
    started = time.perf_counter()
    case, seed = job.case, job.settings.seed
    description = get_model(case.model)
    executable = node_executable()
    if executable is None or missing():
        raise RuntimeError(missing() or "Node.js is not installed")
    if job.weights_path is not None:
        weights = load_weights(description, Path(job.weights_path))  # checked against the schema here, once
        weights_path = job.weights_path
    else:
        weights = description.canonical_weights(seed)
        weights_path = str(folder / "weights.safetensors")
        save_file({name: np.ascontiguousarray(value) for name, value in weights.items()}, weights_path)
    save_file(description.make_inputs(case.batch_size, case.seq_len, seed), str(folder / "inputs.safetensors"))
    parity_path = None
    if job.check_parity and job.verify_output is None:
        arrays = description.make_inputs(*description.parity_shape(), seed)
        reference = description.reference_forward(weights, arrays)
        if reference is not None:
            parity_path = str(folder / "parity.safetensors")
            tensors = {f"input/{name}": value for name, value in arrays.items()}
            tensors.update(
                {f"reference/{name}": np.asarray(value, dtype=np.float64) for name, value in reference.items()}
            )
            save_file(tensors, parity_path)
    cell = {
        "job": json.loads(job.to_json()),
        "model": {
            "name": description.name,
            "arch": description.arch,
            "file": str(models_dir() / f"{description.arch}.mjs"),
            "structure": model_structure(description),
            "outputs": list(description.output_names),
        },
        "weights": weights_path,
        "inputs": str(folder / "inputs.safetensors"),
        "parity": parity_path,
        "parity_shape": list(description.parity_shape()),
        "tolerance_rel_l2": parity_tolerance(description.name, case.dtype),
        "folder": str(folder),
        "python": sys.executable,  # the parity check: python -m fwbench.runner.external compare
        "prepare_s": time.perf_counter() - started,
    }
    (folder / "cell.json").write_text(json.dumps(cell))
    return [executable, str(WORKER_SCRIPT)]

"""The Python side of the TensorFlow.js worker: whether it can run here (:func:`missing`, :func:`missing_model`) and
what it reads (:func:`prepare`), written by the cell's Python worker before that process becomes ``node
worker.mjs`` (fwbench.runner.external). Numpy and safetensors only: no framework is imported.

What :func:`prepare` writes into the cell's folder (the JavaScript worker removes it before it exits; the manager
removes what a killed worker left):

- ``cell.json``: the job as the manager sent it (``job``), the model's name, model file, structure (what its
  ``<arch>.mjs`` builds from) and output names (``model``), fwbench.measure.timer's constants (``timer``), the
  compared shape, the Python that checks parity, and the paths below;
- the weights (the job's ``weights_path``, else ``weights.safetensors``: the seeded canonical set), float32, in the
  canonical names and layouts (torch's: linear weights (out, in), convolutions (out, in, kh, kw));
- ``inputs.safetensors``: the inputs at the cell's shape (int32 token ids, float32 pixels, channels first; phase
  generate: the prompt's ``input_ids``, and the weights are the phase's seeded ones);
- ``parity.safetensors``: the inputs at the compared shape (:func:`compared_shape`; ``input/<name>``) and the float64
  reference outputs on them (``reference/<name>``), which ``python -m fwbench.runner.external compare`` checks the
  worker's outputs and checkpoints against.
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

from fwbench.measure.timer import HF2019_NUMBER, MAX_SETTLE_CALLS, SETTLE_RATIO
from fwbench.messages import Job
from fwbench.models import get_model
from fwbench.models.base import ModelDescription
from fwbench.models.decoder import CausalDecoder
from fwbench.models.generation import generation_weights, prompt_ids
from fwbench.models.weights_io import load_weights

PACKAGE_DIR = Path(__file__).resolve().parent
WORKER_SCRIPT = PACKAGE_DIR / "worker.mjs"
NODE_PACKAGES = ("@tensorflow/tfjs-core", "@tensorflow/tfjs-backend-cpu", "@tensorflow/tfjs-backend-wasm")
MIN_NODE = (18, 0, 0)  # the oldest Node.js the packages and the worker's syntax need (tested here on 20)
NODE_ENV = "FWBENCH_NODE"  # the Node.js executable to run (default: node on PATH)
MODELS_ENV = "FWBENCH_TFJS_MODELS"  # a folder of <arch>.mjs files used instead of this package's (model development)
INSTALL_HINT = "make install (it runs scripts/ensure-node-packages)"


def node_executable() -> str | None:
    """The Node.js executable: ``$FWBENCH_NODE``, else ``node`` on PATH; None when there is none."""
    return shutil.which(os.environ.get(NODE_ENV) or "node")


@functools.cache
def node_identity(executable: str) -> tuple[tuple[int, ...], str] | None:
    """``executable``'s version and the path of the binary it really is (``process.execPath``: a version manager's
    shim resolved, so that the worker execs Node.js itself), None when it does not answer like Node.js."""
    script = "console.log(process.versions.node + ' ' + process.execPath)"
    try:
        answer = subprocess.run([executable, "-e", script], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.fullmatch(r"(\d+)\.(\d+)\.(\d+) (.+?)\s*", answer)
    if found is None:
        return None
    return tuple(int(part) for part in found.groups()[:3]), found.group(4)


def node_path() -> str:
    """The Node.js binary the worker runs as (:func:`node_identity`); RuntimeError when there is none."""
    executable = node_executable()
    identity = None if executable is None else node_identity(executable)
    if identity is None:
        raise RuntimeError(missing() or "Node.js is not installed")
    return identity[1]


def dotted(version: tuple[int, ...]) -> str:
    """``(18, 0, 0)`` as ``18.0.0``."""
    return ".".join(map(str, version))


def missing() -> str | None:
    """None when the tfjs runtimes can run here, else why not (Node.js absent or too old, packages not installed)."""
    executable = node_executable()
    if executable is None:
        where = (
            f"${NODE_ENV}={os.environ[NODE_ENV]} is not an executable"
            if os.environ.get(NODE_ENV)
            else "no node on PATH"
        )
        return f"Node.js is not installed ({where}): install Node.js {dotted(MIN_NODE)} or later, then {INSTALL_HINT}"
    identity = node_identity(executable)
    if identity is None or identity[0] < MIN_NODE:
        found = "an unreadable version" if identity is None else f"v{dotted(identity[0])}"
        return f"{executable} is {found}; the tfjs runtimes need Node.js {dotted(MIN_NODE)} or later"
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
        globals_ += ["token_type_embeddings"] if description.has_token_types else []
        globals_ += ["pooler"] if description.has_pooler else []
        return {
            "config": dataclasses.asdict(config),
            "checkpoints": [list(description.layer_checkpoints(i)) for i in range(config.layers)],
            "token_types": description.has_token_types,
            "pooler": description.has_pooler,
            "layers": names,
            "globals": {role: [description.param(role, kind=kind) for kind in ("weight", "bias")] for role in globals_},
        }
    if arch == "gpt2":
        return _gpt2_structure(description)
    if arch == "llama":
        return _llama_structure(description)
    if arch == "resnet":
        from fwbench.models.resnet import ResNet

        assert isinstance(description, ResNet)
        return {
            "stem": dataclasses.asdict(description.stem),
            "blocks": [dataclasses.asdict(block) for block in description.blocks],
            "eps": description.config.bn_eps,
        }
    raise NotImplementedError(f"the tfjs worker has no structure for {arch} models")


# gpt2.mjs's name of each layer module -> its canonical suffix (without .weight / .bias)
_GPT2_LAYER_MODULES = {
    "ln_1": "ln_1",
    "c_attn": "attn.c_attn",
    "attn_proj": "attn.c_proj",
    "ln_2": "ln_2",
    "c_fc": "mlp.c_fc",
    "mlp_proj": "mlp.c_proj",
}


def _gpt2_structure(description: ModelDescription) -> dict[str, Any]:
    """gpt2.mjs's structure: the config, each layer's checkpoints and its tensors' canonical names, [weight, bias]
    per module (Conv1D weights (in, out))."""
    from fwbench.models.gpt2 import GPT2, LAYER_SUFFIXES

    assert isinstance(description, GPT2)
    config = description.config

    def pair(module: str) -> list[str]:
        return [f"{module}.weight", f"{module}.bias"]

    assert {suffix for module in _GPT2_LAYER_MODULES.values() for suffix in pair(module)} == set(LAYER_SUFFIXES)
    layer_names = description.checkpoint_names()[1:-1]  # per layer: h.{i}.attn, h.{i}.mlp, h.{i}
    return {
        "config": dataclasses.asdict(config),
        "checkpoints": [list(layer_names[3 * i : 3 * i + 3]) for i in range(config.layers)],
        "names": {
            "wte": "wte.weight",
            "wpe": "wpe.weight",
            "ln_f": pair("ln_f"),
            "layers": [
                {name: pair(f"h.{i}.{module}") for name, module in _GPT2_LAYER_MODULES.items()}
                for i in range(config.layers)
            ],
        },
    }


def _llama_structure(description: ModelDescription) -> dict[str, Any]:
    """llama.mjs's structure: the config, each layer's checkpoints and its tensors' canonical names by projection."""
    from fwbench.models.llama import (
        EMBEDDING,
        FINAL_NORM,
        LAYER_SUFFIXES,
        LM_HEAD,
        Llama,
        layer_checkpoints,
        layer_prefix,
    )

    assert isinstance(description, Llama)
    config = description.config
    leaf = {suffix: suffix.split(".")[-2] for suffix in LAYER_SUFFIXES}  # e.g. self_attn.q_proj.weight -> q_proj
    return {
        "config": dataclasses.asdict(config),
        "checkpoints": [list(layer_checkpoints(i)) for i in range(config.layers)],
        "names": {
            "embedding": EMBEDDING,
            "norm": FINAL_NORM,
            "lm_head": None if config.tied else LM_HEAD,
            "layers": [
                {leaf[suffix]: layer_prefix(i) + suffix for suffix in LAYER_SUFFIXES} for i in range(config.layers)
            ],
        },
    }


def compared_shape(job: Job, description: ModelDescription) -> tuple[int, int | None] | None:
    """The shape whose outputs the worker's check compares with the float64 reference: a timed cell's parity shape
    (``check_parity``), a verify job's own (outputs off the reference are located, as the Python worker does), none
    for ``fwbench diff`` (it compares itself) or without a check."""
    if job.verify_output is not None:
        return None if job.checkpoints else (job.case.batch_size, job.case.seq_len)
    return description.parity_shape() if job.check_parity else None


def write_reference(
    description: ModelDescription, weights: dict[str, np.ndarray], shape: tuple[int, int | None], seed: int, path: Path
) -> bool:
    """The inputs at ``shape`` (``input/<name>``) and the float64 reference outputs on them (``reference/<name>``)
    written to ``path``; False when the model has no reference (nothing written)."""
    arrays = description.make_inputs(*shape, seed)
    reference = description.reference_forward(weights, arrays)
    if reference is None:
        return False
    tensors = {f"input/{name}": value for name, value in arrays.items()}
    tensors.update({f"reference/{name}": np.asarray(value, dtype=np.float64) for name, value in reference.items()})
    save_file(tensors, str(path))
    return True


def cell_inputs(job: Job, description: ModelDescription) -> dict[str, np.ndarray]:
    """The inputs at the cell's shape; phase generate: its prompt ``input_ids`` (batch, prompt_len) int32."""
    case, seed = job.case, job.settings.seed
    if case.phase == "generate" and isinstance(description, CausalDecoder) and case.seq_len is not None:
        return {"input_ids": prompt_ids(description, case.global_batch, case.seq_len, seed)}
    return description.make_inputs(case.batch_size, case.seq_len, seed)


def prepare(job: Job, folder: Path) -> list[str]:
    """Write what the JavaScript worker of ``job`` reads into ``folder`` (module docstring); returns the command
    line that starts it (the worker adds its protocol's arguments)."""
    started = time.perf_counter()
    case, seed = job.case, job.settings.seed
    description = get_model(case.model)
    unavailable = missing()
    if unavailable:
        raise RuntimeError(unavailable)
    generating = case.phase == "generate"
    if job.weights_path is not None:
        weights = load_weights(description, Path(job.weights_path))  # checked against the schema here, once
        weights_path = job.weights_path
    else:
        weights = (
            generation_weights(description, seed)
            if generating and isinstance(description, CausalDecoder)
            else description.canonical_weights(seed)
        )
        weights_path = str(folder / "weights.safetensors")
        save_file({name: np.ascontiguousarray(value) for name, value in weights.items()}, weights_path)
    save_file(cell_inputs(job, description), str(folder / "inputs.safetensors"))
    shape = None if generating else compared_shape(job, description)
    parity_path = folder / "parity.safetensors"
    compared = shape is not None and write_reference(description, weights, shape, seed, parity_path)
    cell = {
        "job": json.loads(job.to_json()),
        "model": {
            "name": description.name,
            "file": str(models_dir() / f"{description.arch}.mjs"),
            "structure": model_structure(description),
            "outputs": list(description.output_names),
        },
        "weights": weights_path,
        "inputs": str(folder / "inputs.safetensors"),
        "parity": str(parity_path) if compared else None,
        "parity_shape": list(shape) if compared and shape is not None else None,
        "timer": {"hf2019_number": HF2019_NUMBER, "settle_ratio": SETTLE_RATIO, "max_settle_calls": MAX_SETTLE_CALLS},
        "folder": str(folder),
        "python": sys.executable,  # the parity check: python -m fwbench.runner.external compare
        "prepare_s": time.perf_counter() - started,
    }
    (folder / "cell.json").write_text(json.dumps(cell))
    return [node_path(), str(WORKER_SCRIPT)]

"""A test-only worker in another language (``fakeext:numpy``, registered by fwbench_test_plugin): its ``prepare``
writes the same folder the tfjs worker reads, and the worker is ``tests/fake_external_worker.py``, a script that
speaks the worker protocol with the standard library and numpy only (no fwbench import), so the hand-over
(fwbench.runner.external: execve, the result pipe, stdin, the prepared folder) and the parity helper are tested
without Node.js. ``$FAKE_EXTERNAL_SCALE`` scales its outputs (1: the reference's)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from safetensors.numpy import save_file

from fwbench.frameworks.tfjs.external import compared_shape, write_reference
from fwbench.measure.timer import HF2019_NUMBER
from fwbench.messages import Job
from fwbench.models import get_model
from fwbench.models.mlp import MLP

WORKER = Path(__file__).with_name("fake_external_worker.py")


def missing() -> str | None:
    return None


def missing_model(arch: str) -> str | None:
    return None if arch == "mlp" else f"no fakeext implementation of {arch}"


def prepare(job: Job, folder: Path) -> list[str]:
    """The mlp's weights, inputs and reference into ``folder``; the script that runs it."""
    description = get_model(job.case.model)
    assert isinstance(description, MLP)
    weights = description.canonical_weights(job.settings.seed)
    save_file(weights, str(folder / "weights.safetensors"))
    save_file(description.make_inputs(job.case.batch_size, None, job.settings.seed), str(folder / "inputs.safetensors"))
    shape = compared_shape(job, description)
    compared = shape is not None and write_reference(
        description, weights, shape, job.settings.seed, folder / "parity.safetensors"
    )
    cell = {  # what python -m fwbench.runner.external compare reads: job, model.name, weights, parity, parity_shape
        "job": json.loads(job.to_json()),
        "model": {"name": description.name},
        "weights": str(folder / "weights.safetensors"),
        "layers": [prefix for prefix, _, _ in description.layers],
        "parity": str(folder / "parity.safetensors") if compared else None,
        "parity_shape": list(shape) if compared and shape is not None else None,
        "python": sys.executable,
        "hf2019_number": HF2019_NUMBER,
    }
    (folder / "cell.json").write_text(json.dumps(cell))
    return [sys.executable, str(WORKER)]

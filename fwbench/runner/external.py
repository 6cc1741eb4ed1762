"""A cell whose runtime has a worker in another language (``RuntimeInfo.external``, e.g. TensorFlow.js in Node.js):
the Python worker writes what that worker reads into a folder of its own (the runtime's ``prepare``: the seeded
weights, the inputs, the float64 reference), then *becomes* it with ``execve``.

So the manager sees one process from start to end, as for every cell: the same pid (its memory high-water mark
restarts with the new program: the preparation's numpy arrays are not counted), the same CPU pinning, process group
and parent-death signal, the result pipe (``--result-fd``) and stdin (the job line was read before: an interleaved
job's commands come only after the worker's ``ready``). The worker speaks the protocol of
:mod:`fwbench.messages`; docs/architecture.md says what it must do.

Its parity check stays Python's: the worker writes its outputs (and checkpoints) at the parity shape to a
safetensors file and runs ``python -m fwbench.runner.external compare FOLDER FILE`` (:func:`compare`), which prints
the check and, for a mismatch, its reason with the first diverging checkpoint, as one JSON line.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from fwbench.messages import Job
from fwbench.orphans import die_with_parent
from fwbench.runner.tempfolders import EXTERNAL_PREFIX


def hand_over(job: Job, external: str, result_fd: int, cpus: Sequence[int], manager_pid: int) -> NoReturn:
    """Prepare ``job`` for the worker of module ``external`` and exec it on ``cpus`` with the protocol's arguments
    (``--result-fd``, ``--manager-pid``, ``--folder``: what it reads, its to remove). Raises (the folder removed)
    when preparing or starting fails: the Python worker reports that as the cell's error."""
    folder = tempfile.mkdtemp(prefix=f"{EXTERNAL_PREFIX}{os.getpid()}-")
    try:
        command = importlib.import_module(external).prepare(job, Path(folder))
        os.sched_setaffinity(0, cpus)  # a worker started beside others: the new program starts on the cell's CPUs
        os.set_inheritable(result_fd, True)
        sys.stdout.flush()
        sys.stderr.flush()
        arguments = ["--result-fd", str(result_fd), "--manager-pid", str(manager_pid), "--folder", folder]
        os.execv(command[0], [*command, *arguments])
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise


def compare(folder: Path, got: Path) -> dict[str, Any]:
    """The parity check of a worker in another language: the outputs in ``got`` (safetensors, by name; checkpoints
    as ``checkpoint/<name>``) against the float64 reference its folder holds (``cell.json``'s ``parity`` file:
    ``input/<name>``, ``reference/<name>``). Returns ``parity`` (fwbench.runner.cell.parity's record with the shape,
    and ``divergence`` when it fails) and ``reason`` (the mismatch's line; None when it passes), as the Python
    worker's check (fwbench.runner.phases.inference.verdict)."""
    from safetensors.numpy import load_file

    from fwbench.models import get_model
    from fwbench.models.weights_io import load_weights
    from fwbench.runner.cell import parity
    from fwbench.runner.divergence import CHECKPOINT_KEY
    from fwbench.runner.phases.inference import located, verdict

    cell = json.loads((folder / "cell.json").read_text())
    description = get_model(cell["model"]["name"])
    dtype = cell["job"]["case"]["dtype"]
    stored = load_file(cell["parity"])
    arrays = {name.removeprefix("input/"): value for name, value in stored.items() if name.startswith("input/")}
    reference = {name.removeprefix("reference/"): v for name, v in stored.items() if name.startswith("reference/")}
    written = load_file(str(got))
    outputs = {name: value for name, value in written.items() if not name.startswith(CHECKPOINT_KEY)}
    captured = {name.removeprefix(CHECKPOINT_KEY): v for name, v in written.items() if name.startswith(CHECKPOINT_KEY)}
    check = parity(outputs, reference, dtype, description.name)
    check["shape"] = cell["parity_shape"]

    def locate() -> dict[str, Any]:
        if not captured:
            return {"unavailable": f"{description.name} has no checkpoints: its outputs are compared"}
        weights = load_weights(description, Path(cell["weights"]))
        return located(description, dtype, weights, arrays, (outputs, reference), captured)

    return {"parity": check, "reason": verdict(check, locate)}


def generation(folder: Path, got: Path) -> dict[str, Any]:
    """Phase generate's record of a worker in another language, as the Python worker's (fwbench.runner.phases.
    generate): its first generation's ``tokens`` (batch, new_tokens) and ``logits`` (batch, new_tokens, vocab), and
    the timed generations' ``prefill_s`` (timed,) and ``decode_s`` (timed, new_tokens - 1), and the first generation's
    seconds ``first_generation_s`` (1,), in ``got`` (safetensors). Returns ``generation`` (details.
    generation), and, where the cell checks parity, ``parity`` and ``reason`` (the mismatch's line; None when it
    passes) against the float64 reference on the prompt and weights the folder holds."""
    from safetensors.numpy import load_file

    from fwbench.models import get_model
    from fwbench.models.decoder import CausalDecoder
    from fwbench.models.weights_io import load_weights
    from fwbench.runner.phases.generate import GenerationTimes, generation_record, token_parity
    from fwbench.spec import Case

    cell = json.loads((folder / "cell.json").read_text())
    job = cell["job"]
    description = get_model(cell["model"]["name"])
    assert isinstance(description, CausalDecoder)
    case = Case.from_dict(job["case"])
    written = load_file(str(got))
    tokens, logits = written["tokens"].astype(np.int64), written["logits"]
    timed = GenerationTimes([float(s) for s in written["prefill_s"]], written["decode_s"].astype(float).tolist())
    new_tokens = int(job["settings"]["new_tokens"])
    first_s = float(written["first_generation_s"][0])
    answer: dict[str, Any] = {
        "generation": generation_record(description, case, new_tokens, tokens, timed, first_s, {}, None),
        "parity": None,
        "reason": None,
    }
    if job["check_parity"]:
        weights = load_weights(description, Path(cell["weights"]))
        prompt = load_file(cell["inputs"])["input_ids"]
        answer["parity"], answer["reason"] = token_parity(description, weights, prompt, tokens, logits, case.dtype)
    return answer


def json_safe(value: Any) -> Any:
    """``value`` as JSON any language parses: a non-finite float as the string ``__fwbench_<Infinity|-Infinity|NaN>__``
    (the worker turns it back into Python's JSON literal when it sends its result, so the stored value stays inf)."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"__fwbench_{json.dumps(value)}__"
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="fwbench: services for workers in other languages")
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("compare", help="print the parity check of a worker's outputs as one JSON line")
    check.add_argument("folder", type=Path, help="the worker's prepared folder (cell.json)")
    check.add_argument("got", type=Path, help="the worker's outputs at the compared shape (safetensors)")
    generated = commands.add_parser(
        "generation", help="print phase generate's record and token check of a worker's generations as one JSON line"
    )
    generated.add_argument("folder", type=Path, help="the worker's prepared folder (cell.json)")
    generated.add_argument("got", type=Path, help="its first generation and the timed ones' seconds (safetensors)")
    parent = os.getppid()
    die_with_parent()  # no orphan when the worker is killed, and (below) no inherited end of its result pipe
    if os.getppid() != parent:
        return 3
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))
    args = parser.parse_args(argv)
    service = compare if args.command == "compare" else generation
    print(json.dumps(json_safe(service(args.folder, args.got))))
    return 0


if __name__ == "__main__":
    sys.exit(main())

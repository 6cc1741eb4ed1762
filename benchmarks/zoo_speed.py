"""Are our implementations as fast as the best public ones? fwbench's models vs Hugging Face transformers.

- ``--framework torch``: our torch BERT / GPT-2 against transformers' ``BertModel`` /
  ``GPT2LMHeadModel`` (ours returns GPT-2's logits too, so both sides include the LM head), eager,
  ``torch.inference_mode``.
- ``--framework tensorflow``: our TensorFlow BERT / GPT-2 against ``TFBertModel`` /
  ``TFGPT2LMHeadModel``, each called through ``tf.function`` with a fixed input signature.
  transformers' TF models need ``tf-keras``; install it with ``--no-deps`` (``make oracles``), or
  it replaces tensorflow-cpu with the full tensorflow package.

Same weights (ours are loaded into transformers' models, which are checked to give our outputs),
same inputs, fp32, full-precision matmuls, one process per framework with the thread budget and
CPU pinning fwbench uses. Calls alternate between the two implementations so that machine drift
hits both; the figure is the ratio of medians, ours / theirs (goal ≤ 1.05).

    .venv/bin/python benchmarks/zoo_speed.py --framework torch [--shapes 1x128,8x128] [--calls 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

from fwbench.measure import environment
from fwbench.messages import thread_environment


def hf_torch_model(description: Any) -> Any:
    """transformers' torch model for ``description``, loaded with our canonical weights."""
    import torch
    import transformers

    c = description.config
    model: Any
    if description.arch == "gpt2":
        model = transformers.GPT2LMHeadModel(
            transformers.GPT2Config(
                vocab_size=c.vocab_size, n_positions=c.max_positions, n_embd=c.hidden, n_layer=c.layers, n_head=c.heads
            )
        )
        prefix = "transformer."
    else:
        model = transformers.BertModel(
            transformers.BertConfig(
                vocab_size=c.vocab_size,
                hidden_size=c.hidden,
                num_hidden_layers=c.layers,
                num_attention_heads=c.heads,
                intermediate_size=c.intermediate,
            )
        )
        prefix = ""
    weights = {prefix + k: torch.from_numpy(v) for k, v in description.canonical_weights(0).items()}
    missing, unexpected = model.load_state_dict(weights, strict=False)
    assert not unexpected and all(m.endswith("lm_head.weight") for m in missing), (missing, unexpected)
    model.tie_weights()
    return model.eval()


def alternate(calls: int, contenders: dict[str, Callable[[], Any]]) -> dict[str, float]:
    """Median seconds per call of each contender, calls interleaved, after 2 warm-up rounds."""
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for round_ in range(calls + 2):
        for name, call in contenders.items():
            start = time.perf_counter()
            call()
            if round_ >= 2:
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--framework", choices=("torch", "tensorflow"), default="torch")
    parser.add_argument("--models", default="bert-base,gpt2")
    parser.add_argument("--shapes", default="1x128,8x128", help="BATCHxSEQ,...")
    parser.add_argument("--calls", type=int, default=10, help="timed calls per implementation and shape")
    args = parser.parse_args()
    threads = environment.physical_core_count()
    os.environ.update(thread_environment(threads, 1))
    os.sched_setaffinity(0, environment.cpus_one_per_core()[:threads])

    import numpy as np

    from fwbench.frameworks import create_backend
    from fwbench.models import get_model
    from fwbench.spec import Settings

    backend = create_backend(
        f"{args.framework}:{'eager' if args.framework == 'torch' else 'function'}", "cpu", Settings(threads=threads)
    )
    backend.configure_threads(threads, 1)
    backend.configure_precision()
    if args.framework == "torch":
        import torch

        torch.inference_mode().__enter__()
    else:
        import tensorflow as tf
        import transformers

    print(f"{args.framework}: {backend.versions()}, {threads} threads")
    for name in args.models.split(","):
        description = get_model(name)
        backend.build(description, description.canonical_weights(0))
        theirs = hf_torch_model(description)
        if args.framework == "tensorflow":
            tf_class = transformers.TFGPT2LMHeadModel if description.arch == "gpt2" else transformers.TFBertModel
            with tempfile.TemporaryDirectory() as folder:
                theirs.save_pretrained(folder)
                theirs = tf_class.from_pretrained(folder, from_pt=True)
        for shape in args.shapes.split(","):
            batch, seq = (int(v) for v in shape.split("x"))
            arrays = description.make_inputs(batch, seq, 0)
            our_inputs = backend.make_inputs(arrays)
            backend.compile(our_inputs)
            if args.framework == "torch":
                their_inputs = {k: torch.from_numpy(v.astype(np.int64)) for k, v in arrays.items()}
                their_call = theirs.__call__
            else:
                their_inputs = {k: tf.constant(v) for k, v in arrays.items()}
                signature = {k: tf.TensorSpec(v.shape, tf.int32) for k, v in their_inputs.items()}
                their_call = tf.function(
                    lambda inputs, model=theirs: model(inputs, training=False), input_signature=[signature]
                )

            def their_step(call: Callable[..., Any] = their_call, inputs: dict[str, Any] = their_inputs) -> Any:
                return call(**inputs) if args.framework == "torch" else call(inputs)

            ours_out = backend.to_numpy(backend.infer(our_inputs))
            theirs_out = their_step()
            key = "logits" if description.arch == "gpt2" else "last_hidden_state"
            theirs_key = np.asarray(theirs_out[key] if args.framework == "tensorflow" else getattr(theirs_out, key))
            rel = float(np.linalg.norm(ours_out[key] - theirs_key) / np.linalg.norm(theirs_key))
            medians = alternate(args.calls, {"ours": backend.make_step(our_inputs), "transformers": their_step})
            print(
                f"{name} b={batch} s={seq}: ours {medians['ours'] * 1e3:.1f} ms, transformers "
                f"{medians['transformers'] * 1e3:.1f} ms, ratio {medians['ours'] / medians['transformers']:.3f} "
                f"(outputs differ by rel L2 {rel:.1e})"
            )


if __name__ == "__main__":
    main()

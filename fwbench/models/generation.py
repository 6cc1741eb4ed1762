"""Greedy text generation as data: the prompt, the weights it is generated with, the float64 reference's logits and the
token check every runtime's tokens pass (phase generate). No framework is imported here.

The algorithm every runtime runs: one prefill call over the prompt (batch, prompt_len) that fills a key/value cache
of fixed length prompt_len + new_tokens and gives the logits of the prompt's last position, then one decode call per
further token (batch, 1) at positions prompt_len, prompt_len + 1, ...; each token is the argmax of the logits before
it (ties to the lowest id, as numpy's argmax). Every row is a full prompt (no padding): batch rows are independent.

The check (:func:`check_tokens`): the reference's causal forward over the prompt and the runtime's own tokens, cache
free, gives the float64 logits every step should have had on that prefix; at each step the runtime's token must be
the reference's argmax, unless the reference's two best logits are closer than the runtime's error may be (a near
tie: the step is marked, and the next steps are still checked exactly, on the prefix the runtime took), and its
logits must be within the inference tolerance. A runtime whose every step passes produced the reference's own greedy
tokens, except where a near tie let it take the other, equally valid one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fwbench.models.base import is_layer_norm_scale, tensor_rng
from fwbench.models.decoder import CausalDecoder

# The seeded weights' matrices times this for phase generate: at the zoo's N(0, 0.02) greedy decoding repeats one token
# (every step's logits nearly flat), which tests a cache badly; at N(0, 0.08) the tokens vary from step to step, and
# full-size models still agree with float64 within fp32's tolerance (at N(0, 0.2) gpt2's logits were 1e-4 off in torch).
GENERATION_WEIGHT_SCALE = 4.0


def generation_weights(description: CausalDecoder, seed: int) -> dict[str, np.ndarray]:
    """The seeded canonical weights with every matrix (2-D tensor: projections, embeddings, LM head) scaled by
    GENERATION_WEIGHT_SCALE; norm scales and biases as seeded."""
    weights = description.canonical_weights(seed)
    scale = np.float32(GENERATION_WEIGHT_SCALE)
    return {name: value * scale if value.ndim == 2 and not is_layer_norm_scale(name) else value
            for name, value in weights.items()}  # fmt: skip


def prompt_ids(description: CausalDecoder, batch_size: int, prompt_len: int, seed: int) -> np.ndarray:
    """The seeded prompt (batch, prompt_len) int32, token ids in [0, vocab), no padding."""
    rng = tensor_rng(seed, f"inputs/prompt/{batch_size}x{prompt_len}")
    vocab = description.config.vocab_size
    return rng.integers(0, vocab, size=(batch_size, prompt_len), dtype=np.int64).astype(np.int32)


def reference_logits(
    description: CausalDecoder, weights: dict[str, np.ndarray], prompt: np.ndarray, tokens: np.ndarray
) -> np.ndarray:
    """The float64 logits (batch, steps, vocab) of each generation step on the prefix ``prompt`` (batch, P) +
    ``tokens`` (batch, steps) took: one cache-free causal forward over prompt + tokens[:, :-1], read at positions
    P - 1 ... P + steps - 2."""
    steps = tokens.shape[1]
    ids = np.concatenate([prompt, tokens[:, : steps - 1]], axis=1).astype(np.int32)
    outputs = description.reference_forward(weights, {"input_ids": ids, "attention_mask": np.ones_like(ids)})
    logits: np.ndarray = outputs["logits"][:, prompt.shape[1] - 1 :]
    return logits


def reference_greedy(
    description: CausalDecoder, weights: dict[str, np.ndarray], prompt: np.ndarray, new_tokens: int
) -> np.ndarray:
    """The float64 reference's own greedy tokens (batch, new_tokens) int32: one cache-free forward over the whole
    sequence per token (tests; a cell checks its tokens with :func:`reference_logits`, one forward in all)."""
    ids = prompt.astype(np.int32)
    for _ in range(new_tokens):
        logits = description.reference_forward(weights, {"input_ids": ids, "attention_mask": np.ones_like(ids)})
        token = logits["logits"][:, -1].argmax(axis=-1).astype(np.int32)
        ids = np.concatenate([ids, token[:, None]], axis=1)
    return ids[:, prompt.shape[1] :]


@dataclass
class TokenCheck:
    """``details.generation.tokens``: the runtime's tokens against the float64 reference on their own prefix.

    ``first_mismatch``: the first (step, row) whose token is not the reference's argmax and is no near tie, or whose
    logits' error is over the tolerance (None: none); ``near_ties``: the (step, row)s whose reference top-two gap was
    within ``√2 · tolerance · ‖reference logits‖₂`` (the most an error within the tolerance can
    move two logits towards each other), and whether the
    runtime took the other token there; ``step_rel_l2``: each step's relative L2 error of the logits (batch, vocab)."""

    tolerance_rel_l2: float
    judged: bool
    steps: int
    first_mismatch: dict[str, Any] | None = None
    near_ties: list[dict[str, int | bool]] = field(default_factory=list)
    step_rel_l2: list[float] = field(default_factory=list)
    first_differing_step: int | None = None

    @property
    def ok(self) -> bool:
        return self.first_mismatch is None

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "judged": self.judged,
            "reference": "numpy-float64, cache-free forward over the prompt and the runtime's tokens",
            "tolerance_rel_l2": self.tolerance_rel_l2,
            "steps": self.steps,
            "first_mismatch": self.first_mismatch,
            "first_differing_step": self.first_differing_step,
            "near_ties": self.near_ties,
            "step_rel_l2": self.step_rel_l2,  # empty: the runtime gave no logits (its tokens alone were checked)
            "max_rel_l2": max(self.step_rel_l2, default=0.0),
        }


def check_tokens(
    tokens: np.ndarray, logits: np.ndarray | None, reference: np.ndarray, tolerance: float, *, judged: bool = True
) -> TokenCheck:
    """The runtime's ``tokens`` (batch, steps) and its ``logits`` (batch, steps, vocab) against the ``reference``
    logits on the same prefix (:func:`reference_logits`), relative L2 ``tolerance`` per step. ``judged`` False
    (bf16): the first step whose token differs and each step's error are reported, no step is a mismatch. ``logits``
    None (a loop that gives none): the tokens alone, near ties from the reference's own top-two gap."""
    check = TokenCheck(tolerance_rel_l2=tolerance, judged=judged, steps=int(tokens.shape[1]))
    for step in range(tokens.shape[1]):
        expected = reference[:, step].astype(np.float64)
        error = 0.0
        if logits is not None:
            got = logits[:, step].astype(np.float64)
            error = float(np.linalg.norm(got - expected) / max(float(np.linalg.norm(expected)), 1e-30))
            check.step_rel_l2.append(error)
        top_two = np.sort(expected, axis=-1)[:, -2:]
        margins = np.sqrt(2.0) * tolerance * np.linalg.norm(expected, axis=-1)
        for row in range(tokens.shape[0]):
            best = int(expected[row].argmax())
            took = int(tokens[row, step])
            tie = bool(top_two[row, 1] - top_two[row, 0] <= margins[row])
            if tie:
                check.near_ties.append({"step": step, "row": row, "took_the_other": took != best})
            if took != best and check.first_differing_step is None:
                check.first_differing_step = step
            if judged and check.first_mismatch is None and took != best and not tie:
                check.first_mismatch = {"step": step, "row": row, "token": took, "reference_token": best,
                                        "why": f"token {took} where the reference's argmax is {best}"}  # fmt: skip
        if judged and check.first_mismatch is None and error > tolerance:
            check.first_mismatch = {"step": step, "row": None, "token": None, "reference_token": None,
                                    "why": f"logits' relative error {error:.3g} > {tolerance:g}"}  # fmt: skip
    return check

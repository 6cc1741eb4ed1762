"""What the causal decoders (GPT-2, the Llama layout) share as descriptions: token inputs without token types, next-token
targets, and the float64 reference's outputs, loss and checkpoints, all from each one's ``reference_hidden`` and the
tensor its LM head multiplies by."""

from __future__ import annotations

from abc import abstractmethod
from typing import Protocol

import numpy as np

from fwbench.models.base import ModelDescription
from fwbench.models.checkpoints import Taps
from fwbench.models.text import next_token_targets, token_inputs
from fwbench.models.training import tied_lm_reference_loss
from fwbench.spec import SpecError


class DecoderConfig(Protocol):
    @property
    def vocab_size(self) -> int: ...

    @property
    def max_positions(self) -> int: ...

    @property
    def layers(self) -> int: ...

    @property
    def hidden(self) -> int: ...

    @property
    def heads(self) -> int: ...


class CausalDecoder(ModelDescription):
    """A causal LM: inputs input_ids, attention_mask (batch, seq) int32; outputs ``last_hidden_state`` (batch, seq,
    hidden) and ``logits`` (batch, seq, vocab) = last_hidden_state @ head.T; trained on the next token."""

    has_sequence = True
    config: DecoderConfig

    def __init__(self, name: str, config: DecoderConfig) -> None:
        self.name = name
        self.config = config
        self.max_seq_len = config.max_positions
        self.output_names = ("last_hidden_state", "logits")

    @abstractmethod
    def head_name(self) -> str:
        """The canonical tensor (vocab, hidden) the LM head multiplies by."""

    @abstractmethod
    def gathered_tables(self) -> tuple[str, ...]:
        """The canonical tensors the forward reads by row (token and position embeddings), not whole."""

    @abstractmethod
    def cache_width(self) -> int:
        """Keys (or values) one layer caches per position and row: heads × head size (key/value heads')."""

    def prefill_flops(self, batch: int, prompt_len: int) -> int:
        """Matmul FLOPs of a prefill: :meth:`forward_flops` over the prompt with the LM head of its last position
        only (2·H·V a row: the prefill's logits are the next token's; the other positions' are never computed)."""
        c = self.config
        return self.forward_flops(batch, prompt_len) - 2 * batch * (prompt_len - 1) * c.hidden * c.vocab_size

    def decode_step_bytes(self, batch: int, position: int) -> int:
        """Bytes one decode step at ``position`` reads from memory at float32, at least: every weight once (the
        embedding tables only their ``batch`` rows, unless the LM head is the embedding), and every layer's cached keys
        and values of positions 0 .. position (what batch 1's decode is bound by: memory bandwidth, not FLOPs)."""
        head = self.head_name()
        weights = 0
        for spec in self.param_schema():
            size = 1
            for dim in spec.shape:
                size *= dim
            gathered = spec.name in self.gathered_tables() and spec.name != head
            weights += batch * spec.shape[-1] if gathered else size
        cache = 2 * self.config.layers * self.cache_width() * (position + 1) * batch
        return 4 * (weights + cache)

    @abstractmethod
    def reference_hidden(
        self, weights: dict[str, np.ndarray], inputs: dict[str, np.ndarray], taps: Taps = None
    ) -> np.ndarray:
        """The float64 last hidden state (batch, seq, hidden); each checkpoint recorded in ``taps`` when a dict."""

    def make_inputs(self, batch_size: int, seq_len: int | None, seed: int = 0) -> dict[str, np.ndarray]:
        if seq_len is None:
            raise SpecError(f"{self.name} needs a sequence length")
        return token_inputs(batch_size, seq_len, self.config.vocab_size, seed, token_types=False)

    def training_unsupported(self) -> str | None:
        return None

    def make_targets(self, batch_size: int, seq_len: int | None, seed: int = 0) -> dict[str, np.ndarray]:
        return next_token_targets(self.make_inputs(batch_size, seq_len, seed))

    def reference_loss(
        self, weights: dict[str, np.ndarray], inputs: dict[str, np.ndarray], targets: dict[str, np.ndarray]
    ) -> float:
        hidden = self.reference_hidden(weights, inputs)
        return tied_lm_reference_loss(hidden, weights[self.head_name()], targets["labels"], targets["label_weights"])

    def reference_checkpoints(
        self, weights: dict[str, np.ndarray], inputs: dict[str, np.ndarray]
    ) -> dict[str, np.ndarray]:
        taps: dict[str, np.ndarray] = {}
        self.reference_hidden(weights, inputs, taps)
        return taps

    def reference_forward(self, weights: dict[str, np.ndarray], inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        x = self.reference_hidden(weights, inputs)
        return {"last_hidden_state": x, "logits": x @ weights[self.head_name()].astype(np.float64).T}

"""The BERT family: BERT encoder + pooler (bert-tiny, bert-base) and DistilBERT (no token types, no pooler).

Post-LN transformer encoder, exact (erf) GELU, LayerNorm eps 1e-12, learned absolute positions.
Parameter names and layouts are Hugging Face transformers' (``BertModel``, ``DistilBertModel``
state dicts; linear weights are (out, in)), so a public checkpoint of either architecture loads.

Frameworks address parameters by *role* (``param(role, layer)``), and the description maps roles
to the variant's own names, so one implementation per framework serves both variants.
Inputs: input_ids, attention_mask (and token_type_ids for BERT), each (batch, seq) int32.
Outputs: ``last_hidden_state`` (batch, seq, hidden) and, for BERT, ``pooler_output`` (batch, hidden).

Training: a masked-LM style token cross-entropy (text.masked_lm_targets) of the tied logits
``last_hidden_state @ word_embeddings.T`` (batch, seq, vocab). No prediction-head transform and no
decoder bias: neither is in the canonical ``BertModel`` weights. The pooler does not reach that loss:
it is frozen in training (not updated, not decayed).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fwbench.models.base import ModelDescription, ParamSpec, normal_weights
from fwbench.models.checkpoints import Taps, tap
from fwbench.models.text import (
    attention,
    gelu_erf,
    layer_norm,
    linear,
    masked_lm_targets,
    token_inputs,
    transformer_layer_flops,
)
from fwbench.models.training import tied_lm_reference_loss
from fwbench.spec import SpecError

# role -> (BERT name, DistilBERT name); "{i}" is the layer index.
_LAYER_ROLES: dict[str, tuple[str, str]] = {
    "query": ("encoder.layer.{i}.attention.self.query", "transformer.layer.{i}.attention.q_lin"),
    "key": ("encoder.layer.{i}.attention.self.key", "transformer.layer.{i}.attention.k_lin"),
    "value": ("encoder.layer.{i}.attention.self.value", "transformer.layer.{i}.attention.v_lin"),
    "attention_out": ("encoder.layer.{i}.attention.output.dense", "transformer.layer.{i}.attention.out_lin"),
    "attention_norm": ("encoder.layer.{i}.attention.output.LayerNorm", "transformer.layer.{i}.sa_layer_norm"),
    "ffn_in": ("encoder.layer.{i}.intermediate.dense", "transformer.layer.{i}.ffn.lin1"),
    "ffn_out": ("encoder.layer.{i}.output.dense", "transformer.layer.{i}.ffn.lin2"),
    "ffn_norm": ("encoder.layer.{i}.output.LayerNorm", "transformer.layer.{i}.output_layer_norm"),
}
_GLOBAL_ROLES: dict[str, tuple[str | None, str | None]] = {
    "word_embeddings": ("embeddings.word_embeddings", "embeddings.word_embeddings"),
    "position_embeddings": ("embeddings.position_embeddings", "embeddings.position_embeddings"),
    "token_type_embeddings": ("embeddings.token_type_embeddings", None),
    "embeddings_norm": ("embeddings.LayerNorm", "embeddings.LayerNorm"),
    "pooler": ("pooler.dense", None),
}
LAYER_ROLES = tuple(_LAYER_ROLES)
# checkpoint -> (BERT name, DistilBERT name): the module of Hugging Face's model whose output the tensor is.
# attention: after the attention's residual LayerNorm; ffn: the feed-forward's output projection, before the
# residual; layer: the layer's output (after its second LayerNorm).
_LAYER_CHECKPOINTS: dict[str, tuple[str, str]] = {
    "attention": ("encoder.layer.{i}.attention.output", "transformer.layer.{i}.sa_layer_norm"),
    "ffn": ("encoder.layer.{i}.output.dense", "transformer.layer.{i}.ffn.lin2"),
    "layer": ("encoder.layer.{i}", "transformer.layer.{i}"),
}
LAYER_CHECKPOINT_KINDS = tuple(_LAYER_CHECKPOINTS)  # per layer, in forward order: attention, ffn, layer


@dataclass(frozen=True)
class BertConfig:
    """Sizes of a BERT-family encoder; ``distil`` selects DistilBERT's names, no token types, no pooler."""

    layers: int
    hidden: int
    heads: int
    intermediate: int
    vocab_size: int = 30522
    max_positions: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    distil: bool = False

    def __post_init__(self) -> None:
        if self.hidden % self.heads:
            raise SpecError(f"hidden size {self.hidden} is not divisible by {self.heads} heads")


class Bert(ModelDescription):
    arch = "bert"
    has_sequence = True

    def __init__(self, name: str, config: BertConfig) -> None:
        self.name = name
        self.config = config
        self.max_seq_len = config.max_positions
        self.output_names = ("last_hidden_state",) if config.distil else ("last_hidden_state", "pooler_output")

    # -- names ------------------------------------------------------------------------------
    def param(self, role: str, layer: int | None = None, kind: str = "weight") -> str:
        """The canonical name of a role's tensor (``kind`` is weight or bias)."""
        column = 1 if self.config.distil else 0
        if role in _LAYER_ROLES:
            if layer is None:
                raise ValueError(f"role {role} needs a layer index")
            prefix = _LAYER_ROLES[role][column].format(i=layer)
        else:
            found = _GLOBAL_ROLES[role][column]
            if found is None:
                raise KeyError(f"{self.name} has no {role}")
            prefix = found
        return f"{prefix}.{kind}"

    def checkpoint(self, kind: str, layer: int | None = None) -> str:
        """The shared name of a checkpoint: ``embeddings`` (after its LayerNorm), ``pooler``, or per layer
        ``attention``, ``ffn``, ``layer`` (see _LAYER_CHECKPOINTS)."""
        if kind in ("embeddings", "pooler"):
            return kind
        return _LAYER_CHECKPOINTS[kind][1 if self.config.distil else 0].format(i=layer)

    def layer_checkpoints(self, layer: int) -> tuple[str, str, str]:
        """Layer ``layer``'s checkpoints, one per LAYER_CHECKPOINT_KINDS (attention, ffn, layer), in that order."""
        attention, ffn, output = (self.checkpoint(kind, layer) for kind in LAYER_CHECKPOINT_KINDS)
        return attention, ffn, output

    def checkpoint_names(self) -> tuple[str, ...]:
        names = [self.checkpoint("embeddings")]
        for i in range(self.config.layers):
            names += self.layer_checkpoints(i)
        return (*names, *(["pooler"] if self.has_pooler else []))

    def reference_checkpoints(
        self, weights: dict[str, np.ndarray], inputs: dict[str, np.ndarray]
    ) -> dict[str, np.ndarray]:
        taps: dict[str, np.ndarray] = {}
        self.reference_forward(weights, inputs, taps)
        return taps

    @property
    def has_token_types(self) -> bool:
        return not self.config.distil

    @property
    def has_pooler(self) -> bool:
        return not self.config.distil

    def param_schema(self) -> list[ParamSpec]:
        c = self.config
        h, inter = c.hidden, c.intermediate
        specs = [
            ParamSpec(self.param("word_embeddings"), (c.vocab_size, h)),
            ParamSpec(self.param("position_embeddings"), (c.max_positions, h)),
        ]
        if self.has_token_types:
            specs.append(ParamSpec(self.param("token_type_embeddings"), (c.type_vocab_size, h)))
        specs += [
            ParamSpec(self.param("embeddings_norm"), (h,)),
            ParamSpec(self.param("embeddings_norm", kind="bias"), (h,)),
        ]
        shapes = {
            "query": (h, h),
            "key": (h, h),
            "value": (h, h),
            "attention_out": (h, h),
            "attention_norm": (h,),
            "ffn_in": (inter, h),
            "ffn_out": (h, inter),
            "ffn_norm": (h,),
        }
        for i in range(c.layers):
            for role, shape in shapes.items():
                specs.append(ParamSpec(self.param(role, i), shape))
                specs.append(ParamSpec(self.param(role, i, "bias"), (shape[0],)))
        if self.has_pooler:
            specs += [ParamSpec(self.param("pooler"), (h, h)), ParamSpec(self.param("pooler", kind="bias"), (h,))]
        return specs

    def canonical_weights(self, seed: int = 0) -> dict[str, np.ndarray]:
        return normal_weights(self.param_schema(), seed)

    def make_inputs(self, batch_size: int, seq_len: int | None, seed: int = 0) -> dict[str, np.ndarray]:
        if seq_len is None:
            raise SpecError(f"{self.name} needs a sequence length")
        return token_inputs(batch_size, seq_len, self.config.vocab_size, seed, self.has_token_types)

    def attention_flops(self, batch_size: int, seq_len: int | None) -> int:
        """Attention's scores and context matmuls: 4·S²·H per layer and sample."""
        s = seq_len or 1
        return batch_size * self.config.layers * 4 * s * s * self.config.hidden

    def forward_flops(self, batch_size: int, seq_len: int | None) -> int:
        """Matmul FLOPs: per layer 8·S·H² (Q, K, V, output) + 4·S·H·I (FFN) + 4·S²·H (scores, context), plus
        the pooler's 2·H² where the model has one."""
        return batch_size * (self.encoder_flops(seq_len) + (2 * self.config.hidden**2 if self.has_pooler else 0))

    def training_forward_flops(self, batch_size: int, seq_len: int | None) -> int:
        """The encoder, then the masked-LM loss's tied logits ``last_hidden_state @ word_embeddings.T``
        (2·S·H·V per sample); the pooler is frozen in training and not run."""
        c, s = self.config, seq_len or 1
        return batch_size * (self.encoder_flops(seq_len) + 2 * s * c.hidden * c.vocab_size)

    def encoder_flops(self, seq_len: int | None) -> int:
        """Matmul FLOPs of the encoder layers for one sample of ``seq_len`` tokens."""
        c = self.config
        return c.layers * transformer_layer_flops(seq_len or 1, c.hidden, c.intermediate)

    def training_unsupported(self) -> str | None:
        return None

    def make_targets(self, batch_size: int, seq_len: int | None, seed: int = 0) -> dict[str, np.ndarray]:
        return masked_lm_targets(self.make_inputs(batch_size, seq_len, seed), self.config.vocab_size, seed)

    def reference_loss(
        self, weights: dict[str, np.ndarray], inputs: dict[str, np.ndarray], targets: dict[str, np.ndarray]
    ) -> float:
        hidden = self.reference_forward(weights, inputs)["last_hidden_state"]
        return tied_lm_reference_loss(
            hidden, weights[self.param("word_embeddings")], targets["labels"], targets["label_weights"]
        )

    def frozen_in_training(self) -> tuple[str, ...]:
        return (self.param("pooler"), self.param("pooler", kind="bias")) if self.has_pooler else ()

    def reference_forward(
        self, weights: dict[str, np.ndarray], inputs: dict[str, np.ndarray], taps: Taps = None
    ) -> dict[str, np.ndarray]:
        c = self.config
        w = {name: value.astype(np.float64) for name, value in weights.items()}

        def norm(x: np.ndarray, role: str, layer: int | None = None) -> np.ndarray:
            return layer_norm(x, w[self.param(role, layer)], w[self.param(role, layer, "bias")], c.layer_norm_eps)

        def dense(x: np.ndarray, role: str, layer: int | None = None) -> np.ndarray:
            return linear(x, w[self.param(role, layer)], w[self.param(role, layer, "bias")])

        ids = inputs["input_ids"]
        seq = ids.shape[1]
        x = w[self.param("word_embeddings")][ids] + w[self.param("position_embeddings")][np.arange(seq)]
        if self.has_token_types:
            x = x + w[self.param("token_type_embeddings")][inputs["token_type_ids"]]
        x = tap(taps, "embeddings", norm(x, "embeddings_norm"))
        allowed = inputs["attention_mask"].astype(bool)[:, None, :]  # (B, 1, S): keys a query may see
        for i in range(c.layers):
            context = attention(dense(x, "query", i), dense(x, "key", i), dense(x, "value", i), c.heads, allowed)
            x = tap(
                taps, self.checkpoint("attention", i), norm(x + dense(context, "attention_out", i), "attention_norm", i)
            )
            ffn = tap(taps, self.checkpoint("ffn", i), dense(gelu_erf(dense(x, "ffn_in", i)), "ffn_out", i))
            x = tap(taps, self.checkpoint("layer", i), norm(x + ffn, "ffn_norm", i))
        outputs = {"last_hidden_state": x}
        if self.has_pooler:
            outputs["pooler_output"] = tap(taps, "pooler", np.tanh(dense(x[:, 0], "pooler")))
        return outputs


BERT_TINY = Bert("bert-tiny", BertConfig(layers=2, hidden=128, heads=2, intermediate=512))
BERT_BASE = Bert("bert-base", BertConfig(layers=12, hidden=768, heads=12, intermediate=3072))
DISTILBERT_BASE = Bert("distilbert-base", BertConfig(layers=6, hidden=768, heads=12, intermediate=3072, distil=True))

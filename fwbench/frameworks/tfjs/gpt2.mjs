import { tap } from './checkpoints.mjs';
import { cacheBias, cacheIndices, written, zeroCache } from './kvcache.mjs';

// GPT-2 in TF.js ops: causal pre-LN decoder, tanh GELU, learned absolute positions, LM head tied to the token
// embedding. Inputs input_ids, attention_mask, (batch, seq) int32 → {last_hidden_state (batch, seq, hidden), logits
// (batch, seq, vocab)}. Weights by the canonical names the structure lists (Hugging Face's GPT2Model); its Conv1D
// weights are (in, out) already, the kernels here, used as they are; attn.c_attn packs Q, K, V along its output.
// `taps`: embeddings, per layer its attention, MLP and layer checkpoints (structure.checkpoints), ln_f. Phase
// generate: newCache and buildCachedForward (kvcache.mjs), both also from buildDecoder.

const MASKED = -1e9; // added to the scores of masked keys: exp underflows to exactly 0 in float32
const GELU_SCALE = Math.sqrt(2 / Math.PI);

/** x (..., in) @ kernel (in, out) + bias, through a 2-D matMul. */
function dense(tf, x, { kernel, bias }) {
  const shape = x.shape;
  const y = tf.add(tf.matMul(tf.reshape(x, [-1, shape[shape.length - 1]]), kernel), bias);
  return tf.reshape(y, [...shape.slice(0, -1), kernel.shape[1]]);
}

/** LayerNorm over the last axis: biased variance, eps inside the square root. */
function layerNorm(tf, x, { gamma, beta }, eps) {
  const { mean, variance } = tf.moments(x, -1, true);
  return tf.add(tf.mul(tf.mul(tf.sub(x, mean), tf.rsqrt(tf.add(variance, eps))), gamma), beta);
}

/** 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))). */
function geluTanh(tf, x) {
  const inner = tf.mul(tf.add(x, tf.mul(tf.mul(tf.mul(x, x), x), 0.044715)), GELU_SCALE);
  return tf.mul(tf.mul(x, 0.5), tf.add(tf.tanh(inner), 1));
}

/** Per layer {keys, values}, each float32 zeros (batch, heads, maxLen, hidden / heads). */
export function newCache(tf, structure, batch, maxLen) {
  const { layers, hidden, heads } = structure.config;
  return zeroCache(tf, layers, batch, heads, maxLen, hidden / heads);
}

/** The decoder of `structure` (prepared by fwbench.frameworks.tfjs.external) over `weights` (CanonicalTensors):
 * {forward (inputs, taps) → outputs, cachedForward (ids, start, cache) → {logits, cache}}, sharing the weights. */
export function buildDecoder(tf, structure, weights) {
  const { config, names } = structure;
  const linear = ([weight, bias]) => ({ kernel: weights.take(weight), bias: weights.take(bias) });
  const norm = ([weight, bias]) => ({ gamma: weights.take(weight), beta: weights.take(bias) });
  const wte = weights.take(names.wte); // (vocab, hidden): the embedding and the tied LM head
  const wpe = weights.take(names.wpe); // (max_positions, hidden)
  const layers = names.layers.map((layer) => ({
    ln1: norm(layer.ln_1),
    qkv: linear(layer.c_attn),
    attnProj: linear(layer.attn_proj),
    ln2: norm(layer.ln_2),
    fc: linear(layer.c_fc),
    mlpProj: linear(layer.mlp_proj),
  }));
  const finalNorm = norm(names.ln_f);
  weights.checkAllUsed();
  const { hidden, heads, layer_norm_eps: eps } = config;
  const d = hidden / heads;

  /** x (B, S, H) → q, k, v, each (B, heads, S, d). */
  const projected = (layer, x) => {
    const [b, s] = x.shape;
    const split = (t) => tf.transpose(tf.reshape(t, [b, s, heads, d]), [0, 2, 1, 3]);
    return tf.split(dense(tf, layerNorm(tf, x, layer.ln1, eps), layer.qkv), 3, -1).map(split);
  };
  /** q (B, heads, S, d) over k, v (B, heads, T, d), bias broadcast to (B, heads, S, T) → the context (B, S, H). */
  const attention = (q, k, v, bias) => {
    const [b, , s] = q.shape;
    const scores = tf.add(tf.div(tf.matMul(q, k, false, true), Math.sqrt(d)), bias);
    return tf.reshape(tf.transpose(tf.matMul(tf.softmax(scores), v), [0, 2, 1, 3]), [b, s, hidden]);
  };
  /** The layer after its attention: x (B, S, H) and the context (B, S, H) → its output. */
  const afterAttention = (layer, x, context, [attentionName, mlpName, layerName] = [], taps = null) => {
    x = tf.add(x, tap(taps, attentionName, dense(tf, context, layer.attnProj)));
    const mlp = dense(tf, geluTanh(tf, dense(tf, layerNorm(tf, x, layer.ln2, eps), layer.fc)), layer.mlpProj);
    return tap(taps, layerName, tf.add(x, tap(taps, mlpName, mlp)));
  };

  const forward = ({ input_ids: ids, attention_mask: mask }, taps = null) => {
    const [b, s] = ids.shape;
    const causal = tf.linalg.bandPart(tf.ones([s, s]), -1, 0);
    const allowed = tf.mul(tf.reshape(causal, [1, 1, s, s]), tf.reshape(tf.cast(mask, 'float32'), [b, 1, 1, s]));
    const bias = tf.mul(tf.sub(1, allowed), MASKED);
    let x = tap(taps, 'embeddings', tf.add(tf.gather(wte, ids), tf.slice(wpe, [0, 0], [s, hidden])));
    layers.forEach((layer, i) => {
      const [q, k, v] = projected(layer, x);
      x = afterAttention(layer, x, attention(q, k, v, bias), structure.checkpoints[i], taps);
    });
    x = tap(taps, 'ln_f', layerNorm(tf, x, finalNorm, eps));
    const logits = tf.reshape(tf.matMul(tf.reshape(x, [-1, hidden]), wte, false, true), [b, s, -1]);
    return { last_hidden_state: x, logits };
  };

  /** ids (B, S) int32 at positions start .. start + S - 1 (`start` a number), `cache` (newCache) → {logits (B,
   * vocab) of the last position, cache: new tensors with their keys and values written at those positions}; every
   * other tensor it makes is freed, `cache` is left to the caller to dispose. */
  const cachedForward = (ids, start, cache) =>
    tf.tidy(() => {
      const [b, s] = ids.shape;
      const rows = cacheIndices(tf, cache[0].keys.shape, start, s); // where every layer's keys and values go
      const bias = cacheBias(tf, start, s, cache[0].keys.shape[2]);
      let x = tf.add(tf.gather(wte, ids), tf.slice(wpe, [start, 0], [s, hidden]));
      const updated = layers.map((layer, i) => {
        const [q, k, v] = projected(layer, x);
        const keys = written(tf, cache[i].keys, k, rows);
        const values = written(tf, cache[i].values, v, rows);
        x = afterAttention(layer, x, attention(q, keys, values, bias));
        return { keys, values };
      });
      const last = layerNorm(tf, tf.reshape(tf.slice(x, [0, s - 1, 0], [b, 1, hidden]), [b, hidden]), finalNorm, eps);
      return { logits: tf.matMul(last, wte, false, true), cache: updated };
    });

  return { forward, cachedForward };
}

/** The inference forward (inputs, taps) → {last_hidden_state, logits} (buildDecoder's). */
export function buildModel(tf, structure, weights) {
  return buildDecoder(tf, structure, weights).forward;
}

/** The generation step (ids, start, cache) → {logits, cache} (buildDecoder's). */
export function buildCachedForward(tf, structure, weights) {
  return buildDecoder(tf, structure, weights).cachedForward;
}

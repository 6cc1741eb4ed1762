import { tap } from './checkpoints.mjs';
import { cacheBias, cacheIndices, written, zeroCache } from './kvcache.mjs';

// The Llama layout in TF.js ops: RMSNorm, rotary positions (rotate_half pairing), SwiGLU, grouped-query attention,
// tied or untied LM head. Inputs input_ids, attention_mask, (batch, seq) int32 → {last_hidden_state (batch, seq,
// hidden), logits (batch, seq, vocab)}. Weights by the canonical names the structure lists (Hugging Face's
// LlamaForCausalLM); linear weights are (out, in), their kernels here (in, out), transposed once when the model is
// built. `taps`: embeddings, per layer its attention, MLP and layer checkpoints (structure.checkpoints), norm. Phase
// generate: newCache and buildCachedForward (kvcache.mjs), both also from buildDecoder.

const MASKED = -1e9; // added to the scores of masked keys: exp underflows to exactly 0 in float32

/** x (..., in) @ kernel (in, out), through a 2-D matMul. */
function project(tf, x, kernel) {
  const shape = x.shape;
  const y = tf.matMul(tf.reshape(x, [-1, shape[shape.length - 1]]), kernel);
  return tf.reshape(y, [...shape.slice(0, -1), kernel.shape[1]]);
}

/** x / sqrt(mean(x²) + eps) · scale over the last axis. */
function rmsNorm(tf, x, scale, eps) {
  return tf.mul(tf.mul(x, tf.rsqrt(tf.add(tf.mean(tf.square(x), -1, true), eps))), scale);
}

/** (cos, sin), each (S, d) at positions start .. start + S - 1: angle position · θ^(−2i/d) for i < d/2, repeated
 * for the second half. */
function rotaryTables(tf, start, seq, headDim, theta) {
  const inverse = [];
  for (let i = 0; i < headDim; i += 2) inverse.push(theta ** (-i / headDim));
  const angles = tf.outerProduct(tf.range(start, start + seq, 1, 'float32'), tf.tensor1d(inverse, 'float32'));
  const both = tf.concat([angles, angles], -1);
  return [tf.cos(both), tf.sin(both)];
}

/** x (B, heads, S, d) with rotary positions: x·cos + rotate_half(x)·sin. */
function rotate(tf, x, cos, sin) {
  const half = x.shape[3] / 2;
  const [first, second] = tf.split(x, [half, half], 3);
  return tf.add(tf.mul(x, cos), tf.mul(tf.concat([tf.neg(second), first], 3), sin));
}

/** Per layer {keys, values}, each float32 zeros (batch, kv_heads, maxLen, hidden / heads). */
export function newCache(tf, structure, batch, maxLen) {
  const { layers, hidden, heads, kv_heads: kvHeads } = structure.config;
  return zeroCache(tf, layers, batch, kvHeads, maxLen, hidden / heads);
}

/** The decoder of `structure` (prepared by fwbench.frameworks.tfjs.external) over `weights` (CanonicalTensors):
 * {forward (inputs, taps) → outputs, cachedForward (ids, start, cache) → {logits, cache}}, sharing the weights. */
export function buildDecoder(tf, structure, weights) {
  const { config, names } = structure;
  const kernel = (name) => weights.take(name, (w) => tf.transpose(w));
  const embedding = weights.take(names.embedding);
  const layers = names.layers.map((layer) => ({
    inputNorm: weights.take(layer.input_layernorm),
    q: kernel(layer.q_proj),
    k: kernel(layer.k_proj),
    v: kernel(layer.v_proj),
    o: kernel(layer.o_proj),
    postNorm: weights.take(layer.post_attention_layernorm),
    gate: kernel(layer.gate_proj),
    up: kernel(layer.up_proj),
    down: kernel(layer.down_proj),
  }));
  const finalNorm = weights.take(names.norm);
  const head = names.lm_head === null ? embedding : weights.take(names.lm_head); // (vocab, hidden)
  weights.checkAllUsed();
  const { heads, kv_heads: kvHeads, rms_norm_eps: eps, rope_theta: theta } = config;
  const d = config.hidden / heads;
  const group = heads / kvHeads; // head h reads key/value head floor(h / group)
  const repeated = []; // the key/value head each query head reads
  for (let h = 0; h < heads; h++) repeated.push(Math.floor(h / group));
  const headIndex = tf.tensor1d(repeated, 'int32');

  /** x (B, S, H), rotary tables (S, d) → q (B, heads, S, d), k and v (B, kv_heads, S, d), q and k rotated. */
  const projected = (layer, x, cos, sin) => {
    const [b, s] = x.shape;
    const split = (t, count) => tf.transpose(tf.reshape(t, [b, s, count, d]), [0, 2, 1, 3]); // (B, count, S, d)
    const a = rmsNorm(tf, x, layer.inputNorm, eps);
    const q = rotate(tf, split(project(tf, a, layer.q), heads), cos, sin);
    const k = rotate(tf, split(project(tf, a, layer.k), kvHeads), cos, sin);
    return [q, k, split(project(tf, a, layer.v), kvHeads)];
  };
  /** q (B, heads, S, d) over k, v (B, kv_heads, T, d), head h reading key/value head h / group, bias broadcast to
   * (B, heads, S, T) → the context (B, S, H). */
  const attention = (q, k, v, bias) => {
    const [b, , s] = q.shape;
    const scores = tf.add(tf.div(tf.matMul(q, tf.gather(k, headIndex, 1), false, true), Math.sqrt(d)), bias);
    const context = tf.matMul(tf.softmax(scores), tf.gather(v, headIndex, 1));
    return tf.reshape(tf.transpose(context, [0, 2, 1, 3]), [b, s, config.hidden]);
  };
  /** The layer after its attention: x (B, S, H) and the context (B, S, H) → its output. */
  const afterAttention = (layer, x, context, [attentionName, mlpName, layerName] = [], taps = null) => {
    x = tf.add(x, tap(taps, attentionName, project(tf, context, layer.o)));
    const m = rmsNorm(tf, x, layer.postNorm, eps);
    const gate = project(tf, m, layer.gate);
    const mlp = project(tf, tf.mul(tf.mul(gate, tf.sigmoid(gate)), project(tf, m, layer.up)), layer.down);
    return tap(taps, layerName, tf.add(x, tap(taps, mlpName, mlp)));
  };

  const forward = ({ input_ids: ids, attention_mask: mask }, taps = null) => {
    const [b, s] = ids.shape;
    const [cos, sin] = rotaryTables(tf, 0, s, d, theta);
    const causal = tf.linalg.bandPart(tf.ones([s, s]), -1, 0);
    const allowed = tf.mul(tf.reshape(causal, [1, 1, s, s]), tf.reshape(tf.cast(mask, 'float32'), [b, 1, 1, s]));
    const bias = tf.mul(tf.sub(1, allowed), MASKED);
    let x = tap(taps, 'embeddings', tf.gather(embedding, ids));
    layers.forEach((layer, i) => {
      const [q, k, v] = projected(layer, x, cos, sin);
      x = afterAttention(layer, x, attention(q, k, v, bias), structure.checkpoints[i], taps);
    });
    x = tap(taps, 'norm', rmsNorm(tf, x, finalNorm, eps));
    const logits = tf.reshape(tf.matMul(tf.reshape(x, [-1, config.hidden]), head, false, true), [b, s, -1]);
    return { last_hidden_state: x, logits };
  };

  /** ids (B, S) int32 at positions start .. start + S - 1 (`start` a number), `cache` (newCache) → {logits (B,
   * vocab) of the last position, cache: new tensors with their keys and values written at those positions}; every
   * other tensor it makes is freed, `cache` is left to the caller to dispose. */
  const cachedForward = (ids, start, cache) =>
    tf.tidy(() => {
      const [b, s] = ids.shape;
      const [cos, sin] = rotaryTables(tf, start, s, d, theta);
      const rows = cacheIndices(tf, cache[0].keys.shape, start, s); // where every layer's keys and values go
      const bias = cacheBias(tf, start, s, cache[0].keys.shape[2]);
      let x = tf.gather(embedding, ids);
      const updated = layers.map((layer, i) => {
        const [q, k, v] = projected(layer, x, cos, sin);
        const keys = written(tf, cache[i].keys, k, rows);
        const values = written(tf, cache[i].values, v, rows);
        x = afterAttention(layer, x, attention(q, keys, values, bias));
        return { keys, values };
      });
      const lastPosition = tf.reshape(tf.slice(x, [0, s - 1, 0], [b, 1, config.hidden]), [b, config.hidden]);
      const last = rmsNorm(tf, lastPosition, finalNorm, eps);
      return { logits: tf.matMul(last, head, false, true), cache: updated };
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

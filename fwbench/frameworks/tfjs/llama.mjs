import { tap } from './checkpoints.mjs';

// The Llama layout in TF.js ops: RMSNorm, rotary positions (rotate_half pairing), SwiGLU, grouped-query attention,
// tied or untied LM head. Inputs input_ids, attention_mask, (batch, seq) int32 → {last_hidden_state (batch, seq,
// hidden), logits (batch, seq, vocab)}. Weights by the canonical names the structure lists (Hugging Face's
// LlamaForCausalLM); linear weights are (out, in), their kernels here (in, out), transposed once when the model is
// built. `taps`: embeddings, per layer its attention, MLP and layer checkpoints (structure.checkpoints), norm.

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

/** (cos, sin), each (S, d): angle position · θ^(−2i/d) for i < d/2, repeated for the second half. */
function rotaryTables(tf, seq, headDim, theta) {
  const inverse = [];
  for (let i = 0; i < headDim; i += 2) inverse.push(theta ** (-i / headDim));
  const angles = tf.outerProduct(tf.range(0, seq, 1, 'float32'), tf.tensor1d(inverse, 'float32'));
  const both = tf.concat([angles, angles], -1);
  return [tf.cos(both), tf.sin(both)];
}

/** x (B, heads, S, d) with rotary positions: x·cos + rotate_half(x)·sin. */
function rotate(tf, x, cos, sin) {
  const half = x.shape[3] / 2;
  const [first, second] = tf.split(x, [half, half], 3);
  return tf.add(tf.mul(x, cos), tf.mul(tf.concat([tf.neg(second), first], 3), sin));
}

/** The decoder of `structure` (prepared by fwbench.frameworks.tfjs.external) over `weights` (CanonicalTensors). */
export function buildModel(tf, structure, weights) {
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

  return ({ input_ids: ids, attention_mask: mask }, taps = null) => {
    const [b, s] = ids.shape;
    const [cos, sin] = rotaryTables(tf, s, d, theta);
    const split = (t, count) => tf.transpose(tf.reshape(t, [b, s, count, d]), [0, 2, 1, 3]); // (B, count, S, d)
    const causal = tf.linalg.bandPart(tf.ones([s, s]), -1, 0);
    const allowed = tf.mul(tf.reshape(causal, [1, 1, s, s]), tf.reshape(tf.cast(mask, 'float32'), [b, 1, 1, s]));
    const bias = tf.mul(tf.sub(1, allowed), MASKED);
    let x = tap(taps, 'embeddings', tf.gather(embedding, ids));
    layers.forEach((layer, i) => {
      const [attentionName, mlpName, layerName] = structure.checkpoints[i];
      const a = rmsNorm(tf, x, layer.inputNorm, eps);
      const q = rotate(tf, split(project(tf, a, layer.q), heads), cos, sin);
      const k = tf.gather(rotate(tf, split(project(tf, a, layer.k), kvHeads), cos, sin), headIndex, 1);
      const v = tf.gather(split(project(tf, a, layer.v), kvHeads), headIndex, 1);
      const scores = tf.add(tf.div(tf.matMul(q, k, false, true), Math.sqrt(d)), bias);
      const context = tf.reshape(tf.transpose(tf.matMul(tf.softmax(scores), v), [0, 2, 1, 3]), [b, s, config.hidden]);
      x = tf.add(x, tap(taps, attentionName, project(tf, context, layer.o)));
      const m = rmsNorm(tf, x, layer.postNorm, eps);
      const gate = project(tf, m, layer.gate);
      const mlp = project(tf, tf.mul(tf.mul(gate, tf.sigmoid(gate)), project(tf, m, layer.up)), layer.down);
      x = tap(taps, layerName, tf.add(x, tap(taps, mlpName, mlp)));
    });
    x = tap(taps, 'norm', rmsNorm(tf, x, finalNorm, eps));
    const logits = tf.reshape(tf.matMul(tf.reshape(x, [-1, config.hidden]), head, false, true), [b, s, -1]);
    return { last_hidden_state: x, logits };
  };
}

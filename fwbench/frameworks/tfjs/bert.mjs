import { tap } from './checkpoints.mjs';

// The BERT family in TF.js ops: post-LN encoder, exact (erf) GELU, learned absolute positions, an optional pooler.
// Inputs input_ids, attention_mask (and token_type_ids), (batch, seq) int32 → {last_hidden_state (batch, seq,
// hidden), pooler_output (batch, hidden)}. Weights by the canonical names the structure lists per role (Hugging
// Face's); linear weights are (out, in), their kernels here (in, out), transposed once when the model is built.
// `taps`: embeddings, per layer its attention, ffn and layer checkpoints (structure.checkpoints), pooler.

const SQRT_HALF = Math.SQRT1_2;
const MASKED = -1e9; // added to the scores of padded keys: exp underflows to exactly 0 in float32

/** x (..., in) @ kernel (in, out) + bias, through a 2-D matMul. */
function dense(tf, x, { kernel, bias }) {
  const shape = x.shape;
  const flat = tf.reshape(x, [-1, shape[shape.length - 1]]);
  const y = tf.add(tf.matMul(flat, kernel), bias);
  return tf.reshape(y, [...shape.slice(0, -1), kernel.shape[1]]);
}

/** LayerNorm over the last axis: biased variance, eps inside the square root. */
function layerNorm(tf, x, { gamma, beta }, eps) {
  const { mean, variance } = tf.moments(x, -1, true);
  return tf.add(tf.mul(tf.mul(tf.sub(x, mean), tf.rsqrt(tf.add(variance, eps))), gamma), beta);
}

function geluErf(tf, x) {
  return tf.mul(tf.mul(x, 0.5), tf.add(tf.erf(tf.mul(x, SQRT_HALF)), 1));
}

/** Multi-head attention of (B, S, H) projections; keyBias (B, 1, 1, S): 0 for real keys, MASKED for padding. */
function attention(tf, q, k, v, heads, keyBias) {
  const [b, s, h] = q.shape;
  const d = h / heads;
  const split = (t) => tf.transpose(tf.reshape(t, [b, s, heads, d]), [0, 2, 1, 3]);
  const scores = tf.add(tf.div(tf.matMul(split(q), split(k), false, true), Math.sqrt(d)), keyBias);
  const context = tf.matMul(tf.softmax(scores), split(v));
  return tf.reshape(tf.transpose(context, [0, 2, 1, 3]), [b, s, h]);
}

/** The encoder of `structure` (prepared by fwbench.frameworks.tfjs.external) over `weights` (CanonicalTensors). */
export function buildModel(tf, structure, weights) {
  const { config } = structure;
  const linear = ([weight, bias]) => ({ kernel: weights.take(weight, (w) => tf.transpose(w)), bias: weights.take(bias) });
  const norm = ([weight, bias]) => ({ gamma: weights.take(weight), beta: weights.take(bias) });
  const table = ([weight]) => weights.take(weight);
  const g = structure.globals;
  const word = table(g.word_embeddings);
  const position = table(g.position_embeddings);
  const tokenType = structure.token_types ? table(g.token_type_embeddings) : null;
  const embeddingsNorm = norm(g.embeddings_norm);
  const layers = [];
  for (let i = 0; i < config.layers; i++) {
    const role = (name) => structure.layers[name][i];
    layers.push({
      query: linear(role('query')),
      key: linear(role('key')),
      value: linear(role('value')),
      attentionOut: linear(role('attention_out')),
      attentionNorm: norm(role('attention_norm')),
      ffnIn: linear(role('ffn_in')),
      ffnOut: linear(role('ffn_out')),
      ffnNorm: norm(role('ffn_norm')),
    });
  }
  const pooler = structure.pooler ? linear(g.pooler) : null;
  weights.checkAllUsed();
  const eps = config.layer_norm_eps;

  return ({ input_ids: ids, attention_mask: mask, token_type_ids: types }, taps = null) => {
    const [b, s] = ids.shape;
    let x = tf.add(tf.gather(word, ids), tf.gather(position, tf.range(0, s, 1, 'int32')));
    if (tokenType !== null) x = tf.add(x, tf.gather(tokenType, types));
    x = tap(taps, 'embeddings', layerNorm(tf, x, embeddingsNorm, eps));
    const keyBias = tf.reshape(tf.mul(tf.sub(1, tf.cast(mask, 'float32')), MASKED), [b, 1, 1, s]);
    layers.forEach((layer, i) => {
      const [attentionName, ffnName, layerName] = structure.checkpoints[i];
      const context = attention(tf, dense(tf, x, layer.query), dense(tf, x, layer.key), dense(tf, x, layer.value), config.heads, keyBias);
      x = tap(taps, attentionName, layerNorm(tf, tf.add(x, dense(tf, context, layer.attentionOut)), layer.attentionNorm, eps));
      const ffn = tap(taps, ffnName, dense(tf, geluErf(tf, dense(tf, x, layer.ffnIn)), layer.ffnOut));
      x = tap(taps, layerName, layerNorm(tf, tf.add(x, ffn), layer.ffnNorm, eps));
    });
    const outputs = { last_hidden_state: x };
    if (pooler !== null) {
      const first = tf.reshape(tf.slice(x, [0, 0, 0], [b, 1, config.hidden]), [b, config.hidden]);
      outputs.pooler_output = tap(taps, 'pooler', tf.tanh(dense(tf, first, pooler)));
    }
    return outputs;
  };
}

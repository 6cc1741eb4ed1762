import { tap } from './checkpoints.mjs';

// The MLP in TF.js ops: matMul + bias, ReLU between layers.
// Input x: (batch, in_features) float32 → {logits: (batch, out_features)}. Canonical weights are (out, in); the
// kernels here are (in, out), transposed once when the model is built. `taps`: every layer's output (after its ReLU)
// by its prefix, when given an object.

/** The MLP of `structure` ({layers: [[prefix, in, out], ...]}) over `weights` (CanonicalTensors). */
export function buildModel(tf, structure, weights) {
  const layers = structure.layers.map(([prefix]) => ({
    kernel: weights.take(`${prefix}.weight`, (w) => tf.transpose(w)),
    bias: weights.take(`${prefix}.bias`),
  }));
  weights.checkAllUsed();
  const last = layers.length - 1;
  const names = structure.layers.map(([prefix]) => prefix);
  return ({ x }, taps = null) => {
    let h = x;
    layers.forEach(({ kernel, bias }, i) => {
      h = tf.add(tf.matMul(h, kernel), bias);
      if (i < last) h = tf.relu(h);
      tap(taps, names[i], h);
    });
    return { logits: h };
  };
}

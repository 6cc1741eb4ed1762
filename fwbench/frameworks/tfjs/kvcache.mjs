// The fixed-size key/value cache of phase generate (fwbench/models/generation.py), shared by the decoders' model
// files: per layer {keys, values}, each (batch, heads, maxLen, headDim) float32, heads first as the attention's
// matMuls read them. TF.js tensors are immutable: a call returns new cache tensors, and the caller disposes the old.

const MASKED = -1e9; // added to the scores of masked keys: exp underflows to exactly 0 in float32

/** Per layer {keys, values}, each float32 zeros (batch, heads, maxLen, headDim). */
export function zeroCache(tf, layers, batch, heads, maxLen, headDim) {
  const cache = [];
  for (let i = 0; i < layers; i++) {
    cache.push({ keys: tf.zeros([batch, heads, maxLen, headDim]), values: tf.zeros([batch, heads, maxLen, headDim]) });
  }
  return cache;
}

const copiesInput = new Map(); // backend name → whether its tensorScatterUpdate leaves its input as it was

/** Whether tf.tensorScatterUpdate on the current backend leaves its input tensor unchanged, probed once per backend:
 * tfjs-backend-cpu 4.22's writes the updates into its input's own array (the output shares it), wasm's copies. */
function scatterCopiesInput(tf) {
  const backend = tf.getBackend();
  if (!copiesInput.has(backend)) {
    copiesInput.set(backend, tf.tidy(() => {
      const probe = tf.zeros([1]);
      tf.tensorScatterUpdate(probe, tf.tensor2d([0], [1, 1], 'int32'), tf.ones([1]));
      return probe.dataSync()[0] === 0;
    }));
  }
  return copiesInput.get(backend);
}

/** The (B·heads·S, 3) int32 indices [b, h, start + i] of the rows of a cache of `shape` (B, heads, maxLen, d) that
 * positions start .. start + S - 1 write, in the order of a (B, heads, S, d) part's rows. */
export function cacheIndices(tf, shape, start, s) {
  const [batch, heads, maxLen] = shape;
  if (!Number.isInteger(start) || start < 0 || start + s > maxLen) {
    throw new Error(`positions ${start} .. ${start + s - 1} are outside a cache of ${maxLen}`);
  }
  const indices = new Int32Array(batch * heads * s * 3);
  let n = 0;
  for (let b = 0; b < batch; b++) {
    for (let h = 0; h < heads; h++) {
      for (let i = 0; i < s; i++) {
        indices[n++] = b;
        indices[n++] = h;
        indices[n++] = start + i;
      }
    }
  }
  return tf.tensor2d(indices, [batch * heads * s, 3], 'int32');
}

/** `cache` (B, heads, maxLen, d) with `part` (B, heads, S, d) written at the rows `indices` (cacheIndices) name: a
 * new tensor through tf.tensorScatterUpdate (one copy of the cache and the part's rows written: at (8, 12, 160, 64)
 * 0.6 ms in wasm, where slices concatenated around the part take 10 ms, and 500 ms in the cpu backend, whose strided
 * slices go element by element), onto a copy of `cache` where the backend's scatter would write into it. */
export function written(tf, cache, part, indices) {
  const [b, heads, , d] = cache.shape;
  const s = part.shape[2];
  if (part.shape[0] !== b || part.shape[1] !== heads || indices.shape[0] !== b * heads * s) {
    throw new Error(`a (${part.shape}) part does not fit ${indices.shape[0]} rows of a (${cache.shape}) cache`);
  }
  const base = scatterCopiesInput(tf) ? cache : tf.add(cache, 0); // tf.clone would share the array
  return tf.tensorScatterUpdate(base, indices, tf.reshape(part, [b * heads * s, d]));
}

/** (1, 1, S, maxLen) float32: 0 where the query at position start + i may see the cached key j (j ≤ start + i),
 * MASKED elsewhere (the cache's positions not yet written included). */
export function cacheBias(tf, start, s, maxLen) {
  const positions = tf.reshape(tf.range(start, start + s, 1, 'int32'), [s, 1]);
  const allowed = tf.lessEqual(tf.reshape(tf.range(0, maxLen, 1, 'int32'), [1, maxLen]), positions);
  return tf.reshape(tf.mul(tf.sub(1, tf.cast(allowed, 'float32')), MASKED), [1, 1, s, maxLen]);
}

// Phase generate in TF.js (fwbench/runner/phases/generate.py says the algorithm): greedy decoding over the model
// file's fixed-size key/value cache (newCache, cachedForward: kvcache.mjs), one prefill call over the prompt, then
// one decode call per further token, each timed on its own. TF.js tensors are immutable: each call returns the cache
// with its positions written, and the old one is disposed here. The cpu and wasm backends run every kernel
// synchronously on this thread, so a call has finished when it returns (no tensor is read back inside the timing).

/** One cell's generations over one cache: `prompt` (batch, prompt_len) int32, `newTokens` per generation, `clock`
 * seconds. Every timed generation's prefill and decode seconds are kept in call order (prefillS, decodeS). */
export class Generator {
  constructor(tf, cachedForward, cache, prompt, newTokens, clock) {
    Object.assign(this, { tf, cachedForward, cache, prompt, newTokens, clock });
    this.promptLen = prompt.shape[1];
    this.prefillS = [];
    this.decodeS = [];
    this.lastTokens = []; // the last generation's token tensors (batch,), one per step
  }

  /** ids (batch, S) at positions start .. start + S - 1 into the cache → [the greedy token (batch,) int32, the
   * logits (batch, vocab)]; the old cache disposed. */
  call(ids, start) {
    const { tf } = this;
    const { logits, cache } = this.cachedForward(ids, start, this.cache);
    tf.dispose(this.cache.flatMap(({ keys, values }) => [keys, values]));
    this.cache = cache;
    return [tf.tidy(() => tf.cast(tf.argMax(logits, -1), 'int32')), logits];
  }

  /** The decode call of `token` (batch,) at `position`. */
  decode(token, position) {
    const ids = this.tf.reshape(token, [token.shape[0], 1]);
    try {
      return this.call(ids, position);
    } finally {
      ids.dispose();
    }
  }

  /** One generation, untimed, keeping every step's logits: {tokens: {shape (batch, new_tokens), data Int32Array},
   * logits: {shape (batch, new_tokens, vocab), data Float32Array}}. */
  kept() {
    const { tf } = this;
    const tokens = [];
    const logits = [];
    let [token, stepLogits] = this.call(this.prompt, 0);
    tokens.push(token);
    logits.push(stepLogits);
    for (let position = this.promptLen; position < this.promptLen + this.newTokens - 1; position++) {
      [token, stepLogits] = this.decode(token, position);
      tokens.push(token);
      logits.push(stepLogits);
    }
    const arrays = { tokens: stacked(tf, tokens), logits: stacked(tf, logits) };
    tf.dispose([...tokens, ...logits]);
    return arrays;
  }

  /** The timed call: one generation, its prefill's and each decode step's seconds appended. */
  generate() {
    const { tf, clock } = this;
    const steps = [];
    const started = clock();
    let [token, logits] = this.call(this.prompt, 0);
    let last = clock();
    this.prefillS.push(last - started);
    logits.dispose();
    const tokens = [token];
    for (let position = this.promptLen; position < this.promptLen + this.newTokens - 1; position++) {
      [token, logits] = this.decode(token, position);
      const now = clock();
      steps.push(now - last);
      last = now;
      logits.dispose();
      tokens.push(token);
    }
    this.decodeS.push(steps);
    tf.dispose(this.lastTokens);
    this.lastTokens = tokens;
  }

  /** The last generation's tokens as {shape (batch, new_tokens), data Int32Array}. */
  lastGenerated() {
    return stacked(this.tf, this.lastTokens);
  }

  /** The last `calls` generations' seconds (the timed ones: warm-up generations come before them) as safetensors
   * arrays: prefill_s (calls,), decode_s (calls, new_tokens - 1), float64. */
  timedSeconds(calls) {
    const prefill = this.prefillS.slice(this.prefillS.length - calls);
    const decode = this.decodeS.slice(this.decodeS.length - calls);
    return {
      prefill_s: { shape: [prefill.length], data: Float64Array.from(prefill) },
      decode_s: { shape: [decode.length, this.newTokens - 1], data: Float64Array.from(decode.flat()) },
    };
  }

  dispose() {
    this.tf.dispose([...this.lastTokens, ...this.cache.flatMap(({ keys, values }) => [keys, values])]);
    this.lastTokens = [];
  }
}

/** Tensors of one shape stacked along a new axis 1, read back: {shape, data}. */
function stacked(tf, tensors) {
  const all = tf.stack(tensors, 1);
  try {
    return { shape: all.shape, data: all.dataSync() };
  } finally {
    all.dispose();
  }
}

/** The first step (column) where two {shape (batch, steps), data} token arrays differ; null when equal. */
export function firstDifference(a, b) {
  const [batch, steps] = a.shape;
  for (let step = 0; step < steps; step++) {
    for (let row = 0; row < batch; row++) if (a.data[row * steps + step] !== b.data[row * steps + step]) return step;
  }
  return null;
}

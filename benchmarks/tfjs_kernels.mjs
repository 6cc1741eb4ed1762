// Where TF.js's WebAssembly backend spends a BERT layer's time in Node.js: the kernels of bert-tiny's attention
// and feed-forward at batch 1 × 128 tokens, each timed alone (milliseconds per call, the median of 50 after 3 warm-up
// calls; one thread, as every tfjs:wasm cell). Run: node benchmarks/tfjs_kernels.mjs [wasm|cpu]
import { createRequire } from 'node:module';

const packages = createRequire(new URL('../fwbench/frameworks/tfjs/package.json', import.meta.url));
const tf = await import(packages.resolve('@tensorflow/tfjs-core'));
const mode = process.argv[2] ?? 'wasm';
await import(packages.resolve(`@tensorflow/tfjs-backend-${mode}`));
await tf.setBackend(mode);
await tf.ready();

function median(f, calls = 50) {
  for (let i = 0; i < 3; i++) tf.tidy(f);
  const times = [];
  for (let i = 0; i < calls; i++) {
    const start = process.hrtime.bigint();
    tf.tidy(f);
    times.push(Number(process.hrtime.bigint() - start) / 1e6);
  }
  return times.sort((a, b) => a - b)[Math.floor(calls / 2)];
}

const [S, H, I, heads] = [128, 128, 512, 2];
const d = H / heads;
const x = tf.randomNormal([S, H]);
const kernel = tf.randomNormal([H, I]);
const kernelOutIn = tf.randomNormal([I, H]);
const q = tf.randomNormal([1, heads, S, d]);
const kT = tf.randomNormal([1, heads, d, S]);
const probs = tf.randomNormal([1, heads, S, S]);
const ffn = tf.randomNormal([S, I]);
const rows = [
  ['2-D matMul (128×128)·(128×512)', 2 * S * H * I, () => tf.matMul(x, kernel)],
  ['2-D matMul, transposeB (512×128 kernel)', 2 * S * H * I, () => tf.matMul(x, kernelOutIn, false, true)],
  ['batched matMul: scores (2 heads)', 2 * heads * S * S * d, () => tf.matMul(q, kT)],
  ['batched matMul: context (2 heads)', 2 * heads * S * S * d, () => tf.matMul(probs, q)],
  ['softmax (1×2×128×128)', 0, () => tf.softmax(probs)],
  ['erf (128×512)', 0, () => tf.erf(ffn)],
  ['moments over the last axis (128×128)', 0, () => tf.moments(x, -1, true)],
];
console.log(`TF.js ${tf.version_core}, backend ${mode}, Node.js ${process.versions.node}`);
for (const [name, flops, f] of rows) {
  const ms = median(f);
  console.log(`${name.padEnd(42)} ${ms.toFixed(3).padStart(8)} ms${flops ? `  ${(flops / ms / 1e6).toFixed(1).padStart(6)} GFLOP/s` : ''}`);
}

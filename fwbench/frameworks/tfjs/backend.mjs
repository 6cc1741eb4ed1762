// The TF.js backend of a cell: the core with its plain JavaScript ('cpu') or WebAssembly ('wasm') backend, the
// model built from its <arch>.mjs file, and what is called on it (the timed step, outputs and checkpoints read back).
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';
import { pathToFileURL } from 'node:url';
import { CanonicalTensors, readSafetensors } from './weights.mjs';

const require = createRequire(import.meta.url);

/** The TF.js core with backend `mode` ('cpu' | 'wasm') set and ready. */
export async function loadTf(mode) {
  const tf = await import('@tensorflow/tfjs-core');
  if (mode === 'cpu') await import('@tensorflow/tfjs-backend-cpu');
  else if (mode === 'wasm') await import('@tensorflow/tfjs-backend-wasm');
  else throw new Error(`tfjs has no mode ${mode} (cpu, wasm)`);
  if (!(await tf.setBackend(mode))) throw new Error(`TF.js could not start its ${mode} backend`);
  await tf.ready();
  return tf;
}

/** The package versions in force ({name: version}). */
export function versions(tf) {
  const version = (name) => JSON.parse(fs.readFileSync(require.resolve(`${name}/package.json`), 'utf8')).version;
  return {
    node: process.versions.node,
    v8: process.versions.v8,
    'tfjs-core': tf.version_core,
    'tfjs-backend-cpu': version('@tensorflow/tfjs-backend-cpu'),
    'tfjs-backend-wasm': version('@tensorflow/tfjs-backend-wasm'),
  };
}

/** What computes a cell's numbers (details.threads_effective): one thread in Node.js. */
export async function threadReport(tf, mode) {
  if (mode === 'wasm') {
    const wasm = await import('@tensorflow/tfjs-backend-wasm');
    return {
      intra_op: wasm.getThreadsCount(),
      inter_op: 1,
      simd: await tf.env().getAsync('WASM_HAS_SIMD_SUPPORT'),
      multithread: await tf.env().getAsync('WASM_HAS_MULTITHREAD_SUPPORT'),
      why: 'TF.js runs its WebAssembly backend single-threaded in Node.js (tensorflow/tfjs#3830)',
    };
  }
  return { intra_op: 1, inter_op: 1, why: 'the plain JavaScript backend computes on the main thread' };
}

/** The model of `model` (cell.json's: its file, structure) built over the weights file at `weightsPath`:
 * {forward (inputs, taps) → outputs, layout (the file's LAYOUT, where it says one)}. */
export async function buildModel(tf, model, weightsPath) {
  const file = await import(pathToFileURL(path.resolve(model.file)).href);
  const weights = new CanonicalTensors(tf, readSafetensors(weightsPath));
  return { forward: file.buildModel(tf, model.structure, weights), layout: file.LAYOUT };
}

/** Phase generate's decoder of `model` over the weights file at `weightsPath`: {cachedForward (ids, start, cache) →
 * {logits, cache}, newCache (batch, maxLen) → the zero cache}; an error where the model file has none. */
export async function buildDecoder(tf, model, weightsPath) {
  const file = await import(pathToFileURL(path.resolve(model.file)).href);
  if (file.buildCachedForward === undefined || file.newCache === undefined) {
    throw new Error(`${path.basename(model.file)} has no cached decoder step (phase generate)`);
  }
  const weights = new CanonicalTensors(tf, readSafetensors(weightsPath));
  return {
    cachedForward: file.buildCachedForward(tf, model.structure, weights),
    newCache: (batch, maxLen) => file.newCache(tf, model.structure, batch, maxLen),
  };
}

/** One forward on `inputs`, read back as {name: {shape, data}}: its outputs, and with `checkpoints` also every
 * checkpoint the model records as `checkpoint/<name>`, from the same call (TF.js runs eagerly: the taps only keep
 * tensors the forward computes anyway, so these outputs are the timed program's). Every tensor is freed. */
export function arraysOf(tf, forward, inputs, checkpoints = false) {
  const tensors = tf.tidy(() => {
    const taps = checkpoints ? {} : null;
    const named = { ...forward(inputs, taps) };
    for (const [name, tensor] of Object.entries(taps ?? {})) named[`checkpoint/${name}`] = tensor;
    return named;
  });
  const arrays = {};
  for (const [name, tensor] of Object.entries(tensors)) arrays[name] = { shape: tensor.shape, data: tensor.dataSync() };
  tf.dispose(Object.values(tensors));
  return arrays;
}

/** The timed call: one forward under tf.tidy, every tensor it made freed before it returns. The cpu and wasm
 * backends run each kernel synchronously on this thread, so when it returns the work is done. */
export function makeStep(tf, forward, inputs) {
  return () => {
    tf.tidy(() => {
      forward(inputs);
    });
  };
}

// The page of a tfjs:wasm-browser cell: TF.js's WebAssembly backend in a cross-origin-isolated page of headless
// Chromium (threads, SIMD), driven by the cell's Node.js worker (worker.mjs, browser.mjs) over the Chrome DevTools
// protocol: each of window.fwbench's functions is one Runtime.evaluate. The timing loops run here, on
// performance.now() (timing.mjs's rules, as in Node.js); the worker only relays their seconds to the manager.
import * as tf from '@tensorflow/tfjs-core';
import { getThreadsCount, setThreadsCount, setWasmPaths, version_wasm } from '@tensorflow/tfjs-backend-wasm';
import { parseSafetensors, serializeSafetensors } from '/pkg/safetensors.mjs';
import { CanonicalTensors, tensorsOf } from '/pkg/weights.mjs';
import { calibrateBlock, timeBlock, warmUp } from '/pkg/timing.mjs';

const clock = () => performance.now() / 1000;
const state = {};

/** The smallest non-zero step of performance.now() seen over `spanMs` milliseconds, in seconds. */
function timerResolution(spanMs = 50) {
  let best = Infinity;
  let previous = performance.now();
  const end = previous + spanMs;
  for (;;) {
    const now = performance.now();
    if (now !== previous) {
      best = Math.min(best, now - previous);
      previous = now;
    }
    if (now > end) return best / 1000;
  }
}

async function fetchSafetensors(url, where) {
  const response = await fetch(url);
  if (!response.ok) throw new Error(`${where}: HTTP ${response.status} for ${url}`);
  return parseSafetensors(new Uint8Array(await response.arrayBuffer()), where);
}

function base64(bytes) {
  let text = '';
  for (let i = 0; i < bytes.length; i += 0x8000) text += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(text);
}

/** The wasm backend with `threads` threads asked for (before it starts: TF.js sizes its pool once): what the page
 * got. */
async function init(threads) {
  setWasmPaths(new URL('/pkg/node_modules/@tensorflow/tfjs-backend-wasm/dist/', location.href).href);
  setThreadsCount(threads);
  if (!(await tf.setBackend('wasm'))) throw new Error('TF.js could not start its wasm backend in the page');
  await tf.ready();
  state.tf = tf;
  const wasmFiles = performance.getEntriesByType('resource').map((entry) => entry.name).filter((name) => name.endsWith('.wasm'));
  return {
    user_agent: navigator.userAgent,
    cross_origin_isolated: self.crossOriginIsolated,
    shared_array_buffer: typeof SharedArrayBuffer !== 'undefined',
    simd: await tf.env().getAsync('WASM_HAS_SIMD_SUPPORT'),
    multithread: await tf.env().getAsync('WASM_HAS_MULTITHREAD_SUPPORT'),
    threads_requested: threads,
    threads_got: getThreadsCount(),
    hardware_concurrency_reported: navigator.hardwareConcurrency,
    timer_resolution_s: timerResolution(),
    wasm_files: wasmFiles.map((name) => name.split('/').pop()),
    versions: { 'tfjs-core': tf.version_core, 'tfjs-backend-wasm': version_wasm },
  };
}

/** The model (its file served under /model/, the weights at /weights, the inputs under /cell/) and the timed step. */
async function build(model) {
  const file = await import(`/model/${model.file}`);
  const weights = new CanonicalTensors(tf, await fetchSafetensors('/weights', 'weights'));
  state.forward = file.buildModel(tf, model.structure, weights);
  state.inputs = tensorsOf(tf, await fetchSafetensors('/cell/inputs.safetensors', 'inputs'));
  state.step = () => {
    tf.tidy(() => {
      state.forward(state.inputs);
    });
  };
  return { layout: file.LAYOUT ?? null };
}

/** One forward with every checkpoint, as safetensors bytes in base64 (backend.mjs arraysOf): on the parity inputs,
 * or with `cell` (fwbench verify / diff) on the cell's own, at its shape. */
async function capture(cell = false) {
  const inputs = cell ? state.inputs : tensorsOf(tf, await fetchSafetensors('/cell/parity.safetensors', 'parity'), 'input/');
  const tensors = tf.tidy(() => {
    const taps = {};
    const named = { ...state.forward(inputs, taps) };
    for (const [name, tensor] of Object.entries(taps)) named[`checkpoint/${name}`] = tensor;
    return named;
  });
  const arrays = {};
  for (const [name, tensor] of Object.entries(tensors)) arrays[name] = { shape: tensor.shape, data: tensor.dataSync() };
  tf.dispose([...Object.values(tensors), ...(cell ? [] : Object.values(inputs))]);
  return base64(serializeSafetensors(arrays));
}

async function kernels(versions) {
  const { kernelLibraries } = await import('/pkg/kernels.mjs');
  return kernelLibraries(tf, 'wasm', state.step, versions);
}

window.fwbench = {
  init,
  build,
  capture,
  kernels,
  firstCall: () => timeBlock(state.step, 1, clock),
  warmUp: (calls, budget, rules) => warmUp(state.step, calls, budget, clock, rules),
  calibrate: (minBlock, budget) => calibrateBlock(state.step, minBlock, budget, clock),
  /** A block of `calls` calls: [seconds, its start as Unix seconds]. */
  block: (calls) => {
    const start = (performance.timeOrigin + performance.now()) / 1000;
    return [timeBlock(state.step, calls, clock), start];
  },
  numTensors: () => tf.memory().numTensors,
};
window.fwbenchLoaded = true;

// The canonical weights in TF.js: safetensors files read in Node.js one tensor at a time (no second copy of a
// 440 MB file in memory), and CanonicalTensors, from which a model file takes each weight once, in its own layout.
import fs from 'node:fs';
import { entries, headerLength } from './safetensors.mjs';

/** Every array of a safetensors file (or those whose names start with `prefix`): {name: {dtype, shape, data}}. */
export function readSafetensors(path, prefix = '') {
  const fd = fs.openSync(path, 'r');
  try {
    const first8 = new Uint8Array(8);
    fs.readSync(fd, first8, 0, 8, 0);
    const length = headerLength(first8);
    const header = Buffer.alloc(length);
    fs.readSync(fd, header, 0, length, 8);
    const arrays = {};
    for (const { name, dtype, shape, start, end, Typed } of entries(header.toString('utf8'), path)) {
      if (!name.startsWith(prefix)) continue;
      const data = new Typed((end - start) / Typed.BYTES_PER_ELEMENT);
      fs.readSync(fd, new Uint8Array(data.buffer), 0, end - start, 8 + length + start);
      arrays[name] = { dtype, shape, data };
    }
    return arrays;
  } finally {
    fs.closeSync(fd);
  }
}

/** A tf.Tensor of one array read by readSafetensors (float32 or int32 as stored). */
export function tensorOf(tf, array) {
  if (array.dtype === 'F32') return tf.tensor(array.data, array.shape, 'float32');
  if (array.dtype === 'I32') return tf.tensor(array.data, array.shape, 'int32');
  throw new Error(`a ${array.dtype} array is not a model input or weight`);
}

/** {name: tf.Tensor} of the arrays whose names start with `prefix` (the prefix removed). */
export function tensorsOf(tf, arrays, prefix = '') {
  const tensors = {};
  for (const [name, array] of Object.entries(arrays)) if (name.startsWith(prefix)) tensors[name.slice(prefix.length)] = tensorOf(tf, array);
  return tensors;
}

/** The canonical weights of one model: a model file takes each tensor once (take), transformed into its own layout
 * at build time; checkAllUsed() fails on a weight the model left out (it would compute something else). */
export class CanonicalTensors {
  constructor(tf, arrays) {
    this.tf = tf;
    this.arrays = arrays;
    this.used = new Set();
  }

  /** The weight `name` as a tensor, with `transform` (a function of the tensor) applied; the untransformed tensor
   * is freed. */
  take(name, transform = (tensor) => tensor) {
    const array = this.arrays[name];
    if (array === undefined) throw new Error(`the weights have no ${name}`);
    this.used.add(name);
    const tensor = tensorOf(this.tf, array);
    const result = this.tf.tidy(() => transform(tensor));
    if (result !== tensor) tensor.dispose();
    return result;
  }

  checkAllUsed() {
    const unused = Object.keys(this.arrays).filter((name) => !this.used.has(name));
    if (unused.length) throw new Error(`the model left weights unused: ${unused.slice(0, 5).join(', ')}`);
    this.arrays = {}; // the JavaScript copies are the garbage collector's now
  }
}

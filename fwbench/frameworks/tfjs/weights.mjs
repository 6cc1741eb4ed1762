// Arrays on disk and the canonical weights in TF.js: safetensors files read and written (the format: an 8-byte
// little-endian header length, a JSON header of {name: {dtype, shape, data_offsets}}, then the raw little-endian
// bytes), and CanonicalTensors, from which a model file takes each weight once, in its own layout.
import fs from 'node:fs';

const TYPED = { F32: Float32Array, F64: Float64Array, I32: Int32Array, I64: BigInt64Array };

/** Every array of a safetensors file: {name: {dtype, shape, data (a typed array of its own)}}. */
export function readSafetensors(path) {
  const fd = fs.openSync(path, 'r');
  try {
    const length = Buffer.alloc(8);
    fs.readSync(fd, length, 0, 8, 0);
    const headerBytes = Number(length.readBigUInt64LE(0));
    const header = Buffer.alloc(headerBytes);
    fs.readSync(fd, header, 0, headerBytes, 8);
    const arrays = {};
    for (const [name, info] of Object.entries(JSON.parse(header.toString('utf8')))) {
      if (name === '__metadata__') continue;
      const Typed = TYPED[info.dtype];
      if (Typed === undefined) throw new Error(`${path}: ${name} has dtype ${info.dtype}, not one of ${Object.keys(TYPED)}`);
      const [start, end] = info.data_offsets;
      const data = new Typed((end - start) / Typed.BYTES_PER_ELEMENT);
      fs.readSync(fd, new Uint8Array(data.buffer), 0, end - start, 8 + headerBytes + start);
      arrays[name] = { dtype: info.dtype, shape: info.shape, data };
    }
    return arrays;
  } finally {
    fs.closeSync(fd);
  }
}

/** Write {name: {shape, data (Float32Array | Int32Array | Float64Array)}} as a safetensors file. */
export function writeSafetensors(path, arrays) {
  const header = {};
  let offset = 0;
  for (const [name, { shape, data }] of Object.entries(arrays)) {
    const dtype = Object.keys(TYPED).find((key) => data instanceof TYPED[key]);
    header[name] = { dtype, shape, data_offsets: [offset, offset + data.byteLength] };
    offset += data.byteLength;
  }
  let text = JSON.stringify(header);
  text += ' '.repeat((8 - ((8 + Buffer.byteLength(text)) % 8)) % 8); // the data starts 8-byte aligned
  const length = Buffer.alloc(8);
  length.writeBigUInt64LE(BigInt(Buffer.byteLength(text)));
  const parts = [length, Buffer.from(text, 'utf8')];
  for (const { data } of Object.values(arrays)) parts.push(Buffer.from(data.buffer, data.byteOffset, data.byteLength));
  fs.writeFileSync(path, Buffer.concat(parts));
}

/** A tf.Tensor of one array read by readSafetensors (float32 or int32 as stored). */
export function tensorOf(tf, array) {
  if (array.dtype === 'F32' || array.dtype === 'I32') return tf.tensor(array.data, array.shape, array.dtype === 'F32' ? 'float32' : 'int32');
  throw new Error(`a ${array.dtype} array is not a model input or weight`);
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

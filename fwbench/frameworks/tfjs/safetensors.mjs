// safetensors, in any JavaScript engine (Node.js and the browser): an 8-byte little-endian header length, a JSON
// header of {name: {dtype, shape, data_offsets}} (offsets into the data after the header), then the raw
// little-endian bytes.

const TYPED = { F32: Float32Array, F64: Float64Array, I32: Int32Array, I64: BigInt64Array };

/** The header's length in bytes, from the file's first 8 bytes (a Uint8Array). */
export function headerLength(first8) {
  return Number(new DataView(first8.buffer, first8.byteOffset, 8).getBigUint64(0, true));
}

/** The arrays a header (its JSON text) describes: [{name, dtype, shape, start, end, Typed}], offsets into the data
 * (which starts at 8 + the header's length). */
export function entries(headerText, where) {
  return Object.entries(JSON.parse(headerText))
    .filter(([name]) => name !== '__metadata__')
    .map(([name, info]) => {
      const Typed = TYPED[info.dtype];
      if (Typed === undefined) throw new Error(`${where}: ${name} has dtype ${info.dtype}, not one of ${Object.keys(TYPED)}`);
      return { name, dtype: info.dtype, shape: info.shape, start: info.data_offsets[0], end: info.data_offsets[1], Typed };
    });
}

/** Every array of a whole safetensors file in memory (a Uint8Array): {name: {dtype, shape, data}}, each data a
 * typed array of its own. */
export function parseSafetensors(bytes, where = 'safetensors') {
  const length = headerLength(bytes);
  const arrays = {};
  for (const { name, dtype, shape, start, end, Typed } of entries(new TextDecoder().decode(bytes.subarray(8, 8 + length)), where)) {
    arrays[name] = { dtype, shape, data: new Typed(bytes.slice(8 + length + start, 8 + length + end).buffer) };
  }
  return arrays;
}

/** {name: {shape, data (Float32Array | Float64Array | Int32Array)}} as the bytes of a safetensors file. */
export function serializeSafetensors(arrays) {
  const header = {};
  let offset = 0;
  for (const [name, { shape, data }] of Object.entries(arrays)) {
    const dtype = Object.keys(TYPED).find((key) => data instanceof TYPED[key]);
    header[name] = { dtype, shape, data_offsets: [offset, offset + data.byteLength] };
    offset += data.byteLength;
  }
  let text = JSON.stringify(header);
  const encoder = new TextEncoder();
  text += ' '.repeat((8 - ((8 + encoder.encode(text).length) % 8)) % 8); // the data starts 8-byte aligned
  const headerBytes = encoder.encode(text);
  const bytes = new Uint8Array(8 + headerBytes.length + offset);
  new DataView(bytes.buffer).setBigUint64(0, BigInt(headerBytes.length), true);
  bytes.set(headerBytes, 8);
  let at = 8 + headerBytes.length;
  for (const { data } of Object.values(arrays)) {
    bytes.set(new Uint8Array(data.buffer, data.byteOffset, data.byteLength), at);
    at += data.byteLength;
  }
  return bytes;
}

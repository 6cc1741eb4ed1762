// The kernel libraries a TF.js cell ran (details.kernels; fwbench.frameworks.base.Backend.kernel_libraries in the
// Python workers): the kernels of one more, untimed call of the step as tf.profile lists them, and the backend's
// own report: wasm, TF.js's WebAssembly kernels (XNNPACK inside) with WebAssembly SIMD as
// tf.env().getAsync('WASM_HAS_SIMD_SUPPORT') says; cpu, plain JavaScript, which reports no instruction set.

/** details.kernels of a cell whose timed call is `step` on TF.js backend `mode` ('cpu' | 'wasm'); `versions`: the
 * package versions (backend.mjs versions()). */
export async function kernelLibraries(tf, mode, step, versions) {
  const profile = await tf.profile(() => {
    step();
  });
  const ops = [...new Set(profile.kernelNames)].sort();
  if (mode === 'wasm') {
    const simd = await tf.env().getAsync('WASM_HAS_SIMD_SUPPORT');
    const multithread = await tf.env().getAsync('WASM_HAS_MULTITHREAD_SUPPORT');
    const version = versions['tfjs-backend-wasm'] ?? null;
    return [{
      library: 'TF.js wasm (XNNPACK)',
      version,
      isa: simd ? 'WebAssembly SIMD128' : 'WebAssembly (no SIMD)',
      ops,
      source: "tf.profile kernelNames; tf.env().getAsync('WASM_HAS_SIMD_SUPPORT')",
      multithread,
      host_isa_not_reported: "V8 compiles the WebAssembly to the host's instructions and does not report which",
      ...(version === null ? { not_reported: 'tfjs-backend-wasm reported no version' } : {}),
    }];
  }
  return [{
    library: 'TF.js cpu (JavaScript)',
    version: versions['tfjs-backend-cpu'] ?? null,
    isa: null,
    ops,
    source: 'tf.profile kernelNames',
    not_reported: "plain JavaScript kernels compiled by V8's JIT: no instruction set is reported",
  }];
}

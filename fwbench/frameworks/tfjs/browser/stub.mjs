// Stands in for the Node.js builtins (fs, path, perf_hooks, os) that tf-backend-wasm.fesm.js imports.
export default {};

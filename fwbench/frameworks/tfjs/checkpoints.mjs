// Named checkpoints (fwbench/models/checkpoints.py): a model's forward records an intermediate tensor under the
// shared name its description gives it, only when it is given a `taps` object (null on every timed call).

/** `tensor`, recorded as taps[name] when `taps` is an object. */
export function tap(taps, name, tensor) {
  if (taps) taps[name] = tensor;
  return tensor;
}

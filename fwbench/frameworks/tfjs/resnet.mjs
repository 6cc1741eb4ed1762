import { tap } from './checkpoints.mjs';

// ResNet v1.5 (bottleneck blocks) in TF.js ops, channels last: conv2d without bias, batch norm in inference form on
// the running statistics (tf.batchNorm), ReLU, a 3x3 max-pool after the stem, global average pool, fc.
// Input pixel_values (batch, 3, H, W) float32, channels first as the canonical inputs are (transposed to NHWC in
// the call, as TensorFlow's model does) → {logits: (batch, classes)}. Canonical conv weights are (out, in, kh, kw);
// the filters here are (kh, kw, in, out), transposed once when the model is built. `taps`: stem (after the max-pool),
// every block by its prefix, avgpool, fc; image checkpoints channels first, as the canonical ones.

export const LAYOUT = 'NHWC inside the call (NCHW input transposed as its first op)';

/** One conv (structure: {name, bn, stride, padding}) and its batch norm, with their tensors taken. */
function convBn(tf, weights, conv) {
  const bn = (suffix) => weights.take(`${conv.bn}.${suffix}`);
  return {
    filter: weights.take(`${conv.name}.weight`, (w) => tf.transpose(w, [2, 3, 1, 0])),
    stride: conv.stride,
    padding: conv.padding,
    scale: bn('weight'),
    offset: bn('bias'),
    mean: bn('running_mean'),
    variance: bn('running_var'),
  };
}

/** An image checkpoint: NHWC here, recorded NCHW (transposed only when capturing). */
function tapImage(tf, taps, name, x) {
  if (taps) tap(taps, name, tf.transpose(x, [0, 3, 1, 2]));
  return x;
}

function applyConvBn(tf, x, c, eps, relu) {
  const y = tf.batchNorm(tf.conv2d(x, c.filter, c.stride, c.padding), c.mean, c.variance, c.offset, c.scale, eps);
  return relu ? tf.relu(y) : y;
}

/** The ResNet of `structure` ({stem, blocks: [{prefix, convs, downsample}], eps}) over `weights`. */
export function buildModel(tf, structure, weights) {
  const stem = convBn(tf, weights, structure.stem);
  const blocks = structure.blocks.map((block) => ({
    prefix: block.prefix,
    convs: block.convs.map((conv) => convBn(tf, weights, conv)),
    downsample: block.downsample ? convBn(tf, weights, block.downsample) : null,
  }));
  const fc = { kernel: weights.take('fc.weight', (w) => tf.transpose(w)), bias: weights.take('fc.bias') };
  weights.checkAllUsed();
  const eps = structure.eps;

  return ({ pixel_values: pixels }, taps = null) => {
    let x = applyConvBn(tf, tf.transpose(pixels, [0, 2, 3, 1]), stem, eps, true);
    x = tapImage(tf, taps, 'stem', tf.maxPool(x, 3, 2, 1));
    for (const { prefix, convs, downsample } of blocks) {
      const [first, second, third] = convs;
      const h = applyConvBn(tf, applyConvBn(tf, applyConvBn(tf, x, first, eps, true), second, eps, true), third, eps, false);
      const shortcut = downsample ? applyConvBn(tf, x, downsample, eps, false) : x;
      x = tapImage(tf, taps, prefix, tf.relu(tf.add(h, shortcut)));
    }
    const pooled = tap(taps, 'avgpool', tf.mean(x, [1, 2]));
    return { logits: tap(taps, 'fc', tf.add(tf.matMul(pooled, fc.kernel), fc.bias)) };
  };
}

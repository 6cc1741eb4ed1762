"""The common op categories and, per op vocabulary, the table that maps an op name to one (data, not code).

Three vocabularies: ``torch`` (ATen / oneDNN ops and the markers of compiled code, as torch.profiler names
them), ``tensorflow`` (TensorFlow op types, as its profiler names them after the colon of ``name:Type``) and
``xla`` (HLO instruction names as XLA's CPU runtime reports them, for JAX and TensorFlow's XLA clusters; the
numeric suffix ``.12`` and the ``wrapped_`` prefix of a one-op fusion are stripped before matching). Each table is an ordered list of (regular expression,
category); the first expression that matches the whole name wins, and a name no expression matches is
``other`` and is listed in the profile so the table can be improved.

Pooling and reductions count as elementwise/activation (memory-bound work on every element); allocations,
gathers (embedding look-ups) and layout changes as data movement.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Literal, get_args

Category = Literal[
    "matmul/conv",
    "attention/softmax",
    "normalization",
    "elementwise/activation",
    "data movement",
    "compiled fusion",
    "other",
]
CATEGORIES: tuple[Category, ...] = get_args(Category)  # in table order
Vocabulary = Literal["torch", "tensorflow", "xla"]

_ELEMENTWISE_TORCH = (
    "add|add_|sub|sub_|rsub|mul|mul_|div|div_|neg|pow|sqrt|rsqrt|exp|log|tanh|tanh_|gelu|relu|relu_|silu|sigmoid"
    "|erf|clamp|clamp_|clamp_min|clamp_min_|where|masked_fill|masked_fill_|mean|sum|max|min|amax|var|std|abs|square|threshold"
    "|max_pool2d|max_pool2d_with_indices|adaptive_avg_pool2d|_adaptive_avg_pool2d|avg_pool2d|mkldnn_max_pool2d"
    "|dropout|native_dropout|ge|gt|lt|le|eq|ne|logical_not|bitwise_not|_log_softmax_backward_data"
    "|threshold_backward|gelu_backward|tanh_backward|addcmul_|addcdiv_|lerp_|_foreach_\\w+|sign|reciprocal"
    "|mse_loss|nll_loss|nll_loss_forward|nll_loss_backward|cross_entropy_loss|fill_|zero_|maximum|minimum"
)
_DATA_MOVEMENT_TORCH = (
    "copy_|to|_to_copy|contiguous|clone|transpose|t|permute|view|reshape|_reshape_alias|_unsafe_view|expand"
    "|expand_as|slice|select|cat|stack|split|split_with_sizes|chunk|unbind|unsqueeze|squeeze|flatten|as_strided|as_strided_"
    "|index_select|embedding|embedding_backward|embedding_dense_backward|index|index_put_|narrow|empty|empty_like"
    "|empty_strided|zeros|zeros_like|ones|ones_like|full|new_zeros|new_empty|arange|detach|detach_|alias"
    "|lift_fresh|resolve_conj|resolve_neg|to_dense|to_mkldnn|_has_compatible_shallow_copy_type|set_|repeat"
    "|gather|scatter|scatter_add|_cat|constant_pad_nd|pad|tril|triu|clone_|scalar_tensor|resize_|item"
    "|_local_scalar_dense"
)
TABLES: dict[Vocabulary, tuple[tuple[str, Category], ...]] = {
    "torch": (
        (
            r"aten::(addmm|mm|bmm|baddbmm|matmul|linear|einsum|_addmm_activation|conv2d|convolution|_convolution"
            r"|mkldnn_convolution|mkldnn_linear|convolution_backward|mkldnn_convolution_backward|_mkl_linear"
            r"|linear_backward)",
            "matmul/conv",
        ),
        (r"(mkldnn|onednn)::\w*(linear|convolution|matmul|qlinear|qconv)\w*", "matmul/conv"),
        (
            r"aten::(softmax|_softmax|log_softmax|_log_softmax|_softmax_backward_data|scaled_dot_product_attention"
            r"|_scaled_dot_product_\w+)",
            "attention/softmax",
        ),
        (
            r"aten::(layer_norm|native_layer_norm|native_layer_norm_backward|batch_norm|_batch_norm_impl_index"
            r"|native_batch_norm|_native_batch_norm_legit\w*|native_batch_norm_backward|group_norm"
            r"|_batch_norm_with_update|batch_norm_backward|cudnn_batch_norm)",
            "normalization",
        ),
        (f"aten::({_ELEMENTWISE_TORCH})", "elementwise/activation"),
        (f"aten::({_DATA_MOVEMENT_TORCH})", "data movement"),
        (
            r"(Torch-Compiled Region.*|CompiledFunction|CompiledFunctionBackward|## Call CompiledFxGraph.*"
            r"|cpp_fused_\w+|cpp_\w+_kernel\w*|triton_\w+|AOTInductorModel.*|inductor::\w+|extern_kernels\.\w+"
            r"|torch_compile.*|TorchDynamo Cache Lookup|Graph Break.*)",
            "compiled fusion",
        ),
    ),
    "tensorflow": (
        (
            r"(MatMul|BatchMatMul|BatchMatMulV2|BatchMatMulV3|_FusedMatMul|_Mkl\w*MatMul\w*|_MklNative\w*MatMul\w*"
            r"|Conv2D|_FusedConv2D|_Mkl\w*Conv2D\w*|DepthwiseConv2dNative|_Mkl\w*DepthwiseConv2dNative\w*|Einsum"
            r"|_MklEinsum|Conv2DBackpropInput|Conv2DBackpropFilter|_FusedBatchMatMul\w*)",
            "matmul/conv",
        ),
        (
            r"(Softmax|LogSoftmax|_MklSoftmax|SoftmaxCrossEntropyWithLogits|SparseSoftmaxCrossEntropyWithLogits)",
            "attention/softmax",
        ),  # fmt: skip
        (
            r"(FusedBatchNorm\w*|_Mkl\w*FusedBatchNorm\w*|_MklLayerNorm|LayerNorm\w*|FusedBatchNormGrad\w*)",
            "normalization",
        ),  # fmt: skip
        (
            r"(Add|AddV2|AddN|_MklAdd\w*|Sub|Mul|_MklMul|RealDiv|Div|DivNoNan|Neg|Pow|Sqrt|Rsqrt|Exp|Log|Tanh|Erf"
            r"|Relu|Relu6|_MklRelu|Gelu|Sigmoid|Square|SquaredDifference|Mean|Sum|Max|Min|Maximum|Minimum|Prod"
            r"|BiasAdd|BiasAddGrad|Cast|Select|SelectV2|Abs|Sign|Reciprocal|Greater|GreaterEqual|Less|LessEqual"
            r"|Equal|NotEqual|LogicalAnd|LogicalNot|MaxPool|MaxPoolV2|_MklNativeMaxPool|_MklMaxPool|AvgPool"
            r"|_MklNativeAvgPool|MaxPoolGrad\w*|AvgPoolGrad|ReluGrad|TanhGrad|RsqrtGrad|SqrtGrad|SigmoidGrad"
            r"|ResourceApplyAdam\w*|ResourceApply\w+|AssignAddVariableOp|AssignSubVariableOp|Erfc|ArgMax"
            r"|_UnaryOpsComposition)",
            "elementwise/activation",
        ),
        (
            r"(Transpose|_MklTranspose|ConjugateTranspose|Reshape|ConcatV2|Concat|Identity|IdentityN|GatherV2"
            r"|ResourceGather|Gather|GatherNd|Slice|StridedSlice|StridedSliceGrad|Pack|Unpack|Split|SplitV"
            r"|ExpandDims|Squeeze|Tile|Shape|ShapeN|Fill|ZerosLike|OnesLike|Const|_Send|_Recv|_HostSend|_HostRecv"
            r"|ReadVariableOp|AssignVariableOp|_MklToTf|_MklInputConversion|BroadcastTo|BroadcastArgs|Pad|PadV2"
            r"|MirrorPad|OneHot|Range|UnsortedSegmentSum|TensorScatterAdd|ScatterNd|_Arg|_Retval|Snapshot"
            r"|StopGradient|PreventGradient|Size|Rank|EnsureShape|Bitcast|DeepCopy|Empty|_ReadVariablesOp|_EagerConst"
            r"|BroadcastGradientArgs|InvertPermutation)",
            "data movement",
        ),
        (
            r"(_XlaRun|_XlaCompile|_XlaMerge|XlaLaunch|_XlaLaunch|XlaLaunchV2|__inference_\w+|cluster_\w+)",
            "compiled fusion",
        ),  # fmt: skip
    ),
    "xla": (
        (
            r"(dot|dot-general|convolution|__onednn\$\w+|onednn\.\w+|custom-call|cublas\w*|\w*gemm\w*"
            r"|(MatMul|BatchMatMul\w*|Conv2D\w*|Einsum)(_\d+)?)",  # TF op names that XLA clusters keep
            "matmul/conv",
        ),
        (r"(\w*softmax\w*)", "attention/softmax"),
        (r"(\w*(layer_norm|batch_norm|layernorm|batchnorm)\w*)", "normalization"),
        (r"(\w*fusion\w*|\w+_computation\w*|call|while|conditional|jit_\w+|xla_\w+)", "compiled fusion"),
        (
            r"(add|subtract|multiply|divide|negate|power|sqrt|rsqrt|exponential|log|tanh|erf|maximum|minimum|abs"
            r"|sign|compare|select|clamp|convert|reduce|reduce-window|logistic|and|or|not|exponential-minus-one"
            r"|log-plus-one|round-nearest-even|floor|ceil|cbrt|sine|cosine|is-finite)",
            "elementwise/activation",
        ),
        (
            r"(copy|copy-start|copy-done|transpose|reshape|bitcast|broadcast|concatenate|slice|dynamic-slice"
            r"|dynamic-update-slice|gather|scatter|pad|iota|constant|parameter|tuple|get-tuple-element|reverse"
            r"|bitcast-convert|sort|all-reduce|all-gather)",
            "data movement",
        ),
    ),
}
_SUFFIX = re.compile(r"\.\d+$")  # HLO instruction numbering: fusion.12 -> fusion
_WRAPPED = "wrapped_"  # XLA CPU's one-op fusion of an op it runs as its own kernel: categorized as that op


@cache
def _compiled(vocabulary: Vocabulary) -> tuple[tuple[re.Pattern[str], Category], ...]:
    return tuple((re.compile(pattern), category) for pattern, category in TABLES[vocabulary])


def categorize(vocabulary: Vocabulary, op: str) -> Category:
    """The category of ``op`` (an op name as ``vocabulary``'s profiler writes it); ``other`` when no rule matches."""
    name = op
    if vocabulary == "xla":
        name = _SUFFIX.sub("", name).removeprefix(_WRAPPED)
    for pattern, category in _compiled(vocabulary):
        if pattern.fullmatch(name):
            return category
    return "other"

"""The built-in runtimes' records: data, one ``register_runtime(RuntimeInfo(...))`` each, read by the planner,
``fwbench list``, the estimates and the install hints (what each field means: :class:`RuntimeInfo`). Registered when
:mod:`fwbench.frameworks` is imported; nothing here imports a framework."""

from __future__ import annotations

from fwbench.frameworks.registry import RuntimeInfo, builtin_module, register_runtime
from fwbench.frameworks.roles import builtin_package

DEPLOYMENT_NOTE = "deployment; export and load seconds and the artefact's size in details.compile_report"
register_runtime(
    RuntimeInfo(
        name="torch:eager",
        module=builtin_module("torch", "backend"),
        requires=("torch",),
        description="nn.Module called under torch.inference_mode()",
        phases=("inference", "training", "fit", "generate"),
        training="zero_grad, forward + loss, loss.backward(), torch.optim step, eagerly",
        fit="manual DataLoader loop: for x, y in DataLoader(TensorDataset, batch_size, shuffle=False): zero_grad, "
        "forward + F.cross_entropy, backward, torch.optim step, eagerly",
        fit_loader="torch:dataloader",
        dtypes=("fp32", "bf16"),
        native=True,
    )
)
register_runtime(
    RuntimeInfo(
        name="torch:lightning",
        module=builtin_module("torch", "backend"),
        requires=("torch", "lightning"),
        description="PyTorch Lightning (phase fit only)",
        phases=("fit",),
        fit="lightning Trainer.fit: a LightningModule (training_step, configure_optimizers) over the same "
        "DataLoader; accelerator cpu, 1 device, checkpointing, logger, progress bar and model summary off",
        fit_loader="torch:dataloader",
        dtypes=("fp32", "bf16"),
        extras=("torch", "lightning"),
    )
)
register_runtime(
    RuntimeInfo(
        name="torch:script",
        module=builtin_module("torch", "backend"),
        requires=("torch",),
        description="torch.jit.trace + torch.jit.freeze of the nn.Module, under inference_mode",
        note="TorchScript is deprecated upstream since PyTorch 2.9; kept because the 2019 study used it",
        phases=("inference",),
        dtypes=("fp32", "bf16"),
        compile_s=1.0,
        no_generate="not built: TorchScript is deprecated upstream; torch:eager and torch:compile run torch's decoder, "
        "onnxruntime:torch its export",
    )
)
register_runtime(
    RuntimeInfo(
        name="torch:compile",
        module=builtin_module("torch", "backend"),
        requires=("torch",),
        description="torch.compile(fullgraph=True), inductor, mode from --compile-mode (default: default), under inference_mode",
        phases=("inference", "training", "generate"),
        training="forward + loss compiled as one torch.compile(fullgraph=True) graph (AOTAutograd compiles its "
        "backward too), loss.backward() running that compiled backward, then the torch.optim step compiled by "
        "its own torch.compile (the optimizer step cannot share the graph: backward is in between)",
        dtypes=("fp32", "bf16"),
        compile_s=25.0,
    )
)
register_runtime(
    RuntimeInfo(
        name="torch:export",
        module=builtin_module("torch", "backend"),
        requires=("torch",),
        description="torch.export.export per cell shape, compiled ahead of time by AOTInductor "
        "(aoti_compile_and_package to a .pt2, loaded with aoti_load_package), all before the first call; "
        "the loaded runner's Python call is timed, under inference_mode",
        note="TorchScript's successor for deployment",
        phases=("inference",),
        dtypes=("fp32", "bf16"),
        compile_s=20.0,
        artefact="AOTInductor package (.pt2)",
        artefact_suffix=".pt2",
        no_generate="not built yet: the decoder step as two AOTInductor packages (the prefill's shape and the "
        "decode's); torch:compile runs the same inductor code",
    )
)
register_runtime(
    RuntimeInfo(
        name="tensorflow:eager",
        module=builtin_module("tensorflow", "backend"),
        requires=("tensorflow",),
        description="tf.Module of tf ops called eagerly",
        phases=("inference", "training", "generate"),
        training="forward + loss under tf.GradientTape, then a Keras 3 optimizer's apply_gradients on the "
        "tf.Variables, eagerly",
        dtypes=("fp32", "bf16"),
        startup_s=5.5,
    )
)
register_runtime(
    RuntimeInfo(
        name="tensorflow:function",
        module=builtin_module("tensorflow", "backend"),
        requires=("tensorflow",),
        description="tf.function with the input signature fixed per cell (no retracing)",
        phases=("inference", "training", "fit", "generate"),
        training="one tf.function: forward + loss under tf.GradientTape, gradients, a Keras 3 optimizer's "
        "apply_gradients on the tf.Variables",
        fit="manual custom loop: for x, y in tf.data.Dataset.from_tensor_slices(...).batch(batch_size): the "
        "tf.function step (GradientTape, a Keras 3 optimizer's apply_gradients)",
        fit_loader="tensorflow:data",
        dtypes=("fp32", "bf16"),
        native=True,
        startup_s=5.5,
        compile_s=0.5,
    )
)
register_runtime(
    RuntimeInfo(
        name="tensorflow:xla",
        module=builtin_module("tensorflow", "backend"),
        requires=("tensorflow",),
        description="tf.function(jit_compile=True) with the input signature fixed per cell",
        phases=("inference", "training", "generate"),
        training="the tensorflow:function step under tf.function(jit_compile=True): tape, gradients and "
        "optimizer update in one XLA program",
        dtypes=("fp32", "bf16"),
        startup_s=5.5,
        compile_s=3.0,
    )
)
register_runtime(
    RuntimeInfo(
        name="tensorflow:savedmodel",
        module=builtin_module("tensorflow", "backend"),
        requires=("tensorflow",),
        description="tf.saved_model.save with a serving signature (every input axis free), reloaded with tf.saved_model.load; "
        "the reloaded serving_default signature is timed (what TF Serving runs), the built model dropped",
        note="deployment; export and reload seconds and the folder's size in details.compile_report",
        phases=("inference",),
        startup_s=5.5,
        compile_s=2.0,
        artefact="SavedModel folder (saved_model.pb + variables/)",
        no_generate="not built yet: TensorFlow's decoder keeps its cache in tf.Variables, which a serving "
        "signature would have to own; tensorflow:function runs the same graph",
    )
)
register_runtime(
    RuntimeInfo(
        name="onnxruntime:torch",
        module=builtin_module("onnxruntime", "backend"),
        requires=("onnxruntime", "onnx", "onnxscript", "torch"),
        description="our torch model exported by torch.onnx.export(dynamo=True) per cell shape (weights in the file), run by "
        "onnxruntime.InferenceSession, CPUExecutionProvider, graph optimisation ALL; session.run on numpy is timed; "
        "int8: that file dynamically quantised (quantize_dynamic, reduce_range)",
        note=DEPLOYMENT_NOTE,
        phases=("inference", "generate"),
        dtypes=("fp32", "int8"),
        extras=("deploy", "torch"),
        startup_s=3.0,
        compile_s=5.0,
        package=builtin_package("torch"),
        artefact="ONNX file, weights inside",
    )
)
register_runtime(
    RuntimeInfo(
        name="onnxruntime:tensorflow",
        module=builtin_module("onnxruntime", "backend"),
        requires=("onnxruntime", "onnx", "tf2onnx", "tensorflow"),
        description="our tf.function at the cell's input signature converted by tf2onnx (opset 18), run by "
        "onnxruntime.InferenceSession, CPUExecutionProvider, graph optimisation ALL; session.run on numpy is timed; "
        "int8: that file dynamically quantised (quantize_dynamic, reduce_range)",
        note=DEPLOYMENT_NOTE,
        phases=("inference",),
        dtypes=("fp32", "int8"),
        extras=("deploy", "tensorflow"),
        startup_s=5.5,
        compile_s=4.0,
        package=builtin_package("tensorflow"),
        artefact="ONNX file, weights inside",
        no_generate="tf2onnx converts a tf.function at fixed shapes, and TensorFlow's decoder writes its cache "
        "into tf.Variables, which an ONNX graph cannot hold; onnxruntime:torch runs torch's exported decoder step",
    )
)
register_runtime(
    RuntimeInfo(
        name="onnxruntime-genai:torch",
        module=builtin_module("ortgenai", "backend"),
        requires=("onnxruntime_genai", "onnxruntime", "onnx", "onnxscript", "torch"),
        description="ONNX Runtime GenAI's own generation loop (og.Generator: append_tokens, then generate_next_token "
        "per token, greedy, from token ids) over our torch decoder exported once by torch.onnx.export(dynamo=True) "
        "in GenAI's past/present contract with every axis free, and a genai_config.json written from the model's "
        "shape (the cache buffer shared); phase generate only",
        note=DEPLOYMENT_NOTE,
        phases=("generate",),
        extras=("deploy", "torch"),
        startup_s=3.0,
        compile_s=10.0,
        package=builtin_package("torch"),
        artefact="ONNX file, weights inside, with dynamic axes, and genai_config.json",
    )
)
register_runtime(
    RuntimeInfo(
        name="openvino-genai:torch",
        module=builtin_module("ovgenai", "backend"),
        requires=("openvino_genai", "openvino", "onnx", "onnxscript", "torch"),
        description="OpenVINO GenAI's own generation loop (LLMPipeline.generate from token ids, greedy, its stateful "
        "SDPA backend, f32) over our torch decoder exported once by torch.onnx.export(dynamo=True) with its cache "
        "growing and made stateful (a beam_idx input, apply_make_stateful_transformation), beside a config.json "
        "written from the model's shape; a whole generation per call, its steps timed by the loop's own clock; "
        "phase generate only",
        note=DEPLOYMENT_NOTE,
        phases=("generate",),
        extras=("deploy", "torch"),
        startup_s=3.5,
        compile_s=10.0,
        package=builtin_package("torch"),
        artefact="ONNX file, weights inside, with dynamic axes, made a stateful OpenVINO IR",
    )
)
register_runtime(
    RuntimeInfo(
        name="openvino:torch",
        module=builtin_module("openvino", "backend"),
        requires=("openvino", "onnx", "onnxscript", "torch"),
        description="the onnxruntime:torch ONNX file compiled by openvino compile_model(CPU, PERFORMANCE_HINT=LATENCY, "
        "NUM_STREAMS=1, INFERENCE_PRECISION_HINT=f32); InferRequest.infer on numpy is timed",
        note=DEPLOYMENT_NOTE,
        phases=("inference", "generate"),
        extras=("deploy", "torch"),
        startup_s=3.5,
        compile_s=5.0,
        package=builtin_package("torch"),
        artefact="ONNX file, weights inside (what OpenVINO compiles)",
    )
)
register_runtime(
    RuntimeInfo(
        name="litert:tensorflow",
        module=builtin_module("litert", "backend"),
        requires=("ai_edge_litert", "tensorflow"),
        description="our tf.function at the cell's input signature converted by tf.lite.TFLiteConverter (float32; int8: dynamic-range "
        "quantisation), run by the ai_edge_litert Interpreter (XNNPACK); the serving_default signature runner on numpy is "
        "timed",
        note=DEPLOYMENT_NOTE,
        phases=("inference",),
        dtypes=("fp32", "int8"),
        extras=("deploy", "tensorflow"),
        startup_s=5.5,
        compile_s=4.0,
        package=builtin_package("tensorflow"),
        artefact="TFLite flatbuffer, weights inside",
        no_generate="the TFLite converter would have to turn the cache's tf.Variables into resource "
        "variables of the flatbuffer; not built",
    )
)
register_runtime(
    RuntimeInfo(
        name="jax:jit",
        module=builtin_module("jax", "backend"),
        requires=("jax",),
        description="jax.jit of a pure function over a parameter pytree (weights passed as arguments)",
        phases=("inference", "training", "fit", "generate"),
        training="one jax.jit of jax.value_and_grad(loss) + optax update + apply_updates, parameters and "
        "optimizer state donated and carried to the next call",
        fit="manual loop over numpy batch slices: the jitted value_and_grad + optax step, parameters and "
        "optimizer state donated and carried",
        fit_loader="grain:dataloader",
        dtypes=("fp32", "bf16"),
        native=True,
        compile_s=0.5,
    )
)
KERAS_FIT = (
    "keras model.fit(x, y, batch_size, epochs, shuffle=False, verbose=0) on numpy arrays after "
    "model.compile(optimizer, loss, jit_compile='auto')"
)
KERAS_TRAINING = (
    "model.train_on_batch(x, y, sample_weight) after model.compile(optimizer, loss, "
    "jit_compile='auto'), the loss returned as a Python float: "
)
register_runtime(
    RuntimeInfo(
        name="keras:tensorflow",
        module=builtin_module("keras", "backend"),
        requires=("keras", "tensorflow"),
        description="Keras 3 on TensorFlow: model.predict_function([(x,)]) after model.compile(jit_compile='auto'); "
        "a tf.function, XLA only on a GPU",
        phases=("inference", "training", "fit", "generate"),
        training=KERAS_TRAINING + "a tf.function train step (XLA only on a GPU)",
        fit=KERAS_FIT,
        fit_loader="tensorflow:data",
        dtypes=("fp32", "bf16"),
        extras=("keras", "tensorflow"),
        startup_s=6.0,
        compile_s=1.0,
        procs_unsupported="Keras 3 model.fit under tf.distribute.MultiWorkerMirroredStrategy fails before training "
        "(keras-team/keras#20585; Keras 3.15.1 with TensorFlow 2.21: ValueError: Attempt to convert a value "
        "(PerReplica:{...}) with an unsupported type to a Tensor, in _maybe_symbolic_build)",
    )
)
register_runtime(
    RuntimeInfo(
        name="keras:jax",
        module=builtin_module("keras", "backend"),
        requires=("keras", "jax"),
        description="Keras 3 on JAX: model.predict_function(state, iter([(x,)])) after model.compile(jit_compile='auto'); "
        "jax.jit of the stateless predict step, variables donated and the returned state carried to the next call",
        phases=("inference", "training", "fit", "generate"),
        training=KERAS_TRAINING + "jax.jit of the stateless train step; train_on_batch writes the state back "
        "into the variables after each call",
        fit=KERAS_FIT,
        fit_loader="grain:dataloader",
        dtypes=("fp32", "bf16"),
        extras=("keras", "jax"),
        startup_s=6.0,
        compile_s=1.0,
    )
)
register_runtime(
    RuntimeInfo(
        name="keras:torch",
        module=builtin_module("keras", "backend"),
        requires=("keras", "torch"),
        description="Keras 3 on PyTorch: model.predict_function([(x,)]) after model.compile(jit_compile='auto'); "
        "eager under torch.no_grad (auto never picks torch.compile)",
        phases=("inference", "training", "fit", "generate"),
        training=KERAS_TRAINING + "eager forward, backward and optimizer step (auto never picks torch.compile)",
        fit=KERAS_FIT,
        dtypes=("fp32", "bf16"),
        extras=("keras", "torch"),
        startup_s=6.0,
    )
)

DDP_TRAINING = (
    "each process: zero_grad, forward + loss on its rows of the global batch, loss.backward() (DDP all-reduces "
    "the gradients in buckets as they are computed, averaging them), torch.optim step; the loss's weight sum is the "
    "global batch's (one all-reduce of [Σw·CE, Σw] per step), so N processes take the 1-process step"
)
register_runtime(
    RuntimeInfo(
        name="torch:ddp",
        module=builtin_module("torch", "backend"),
        requires=("torch",),
        description="data-parallel training: torch.distributed + DistributedDataParallel, eager (phase training only; --procs)",
        phases=("training", "fit"),
        training=DDP_TRAINING + "; eager",
        fit="torch:eager's manual DataLoader loop with the module under DistributedDataParallel and the DataLoader over a "
        "DistributedSampler(shuffle=False) of the same dataset (at each step the processes together hold the 1-process "
        "global batch's rows); --procs, in-memory dataset only",
        dtypes=("fp32", "bf16"),
        distributed="N worker processes on disjoint cores; torch.distributed process group (gloo on CPU, nccl on CUDA) "
        "over a FileStore rendezvous in a temporary folder (nothing listens but gloo's pair sockets, bound to the "
        "loopback interface: GLOO_SOCKET_IFNAME=lo); DistributedDataParallel with its default 25 MiB buckets",
    )
)
register_runtime(
    RuntimeInfo(
        name="torch:ddp-compile",
        module=builtin_module("torch", "backend"),
        requires=("torch",),
        description="torch:ddp with the DDP-wrapped model under torch.compile (phase training only; --procs)",
        phases=("training",),
        training=DDP_TRAINING
        + "; forward + loss under torch.compile(mode from --compile-mode; DDPOptimizer splits the "
        "graph at bucket boundaries so the all-reduces overlap the backward), the optimizer step compiled by its own "
        "torch.compile",
        dtypes=("fp32", "bf16"),
        compile_s=40.0,
        distributed="as torch:ddp",
    )
)
register_runtime(
    RuntimeInfo(
        name="jax:distributed",
        module=builtin_module("jax", "backend"),
        requires=("jax",),
        description="data-parallel training: multi-controller JAX, jax.distributed + a sharded jit (phase training only; --procs)",
        phases=("training",),
        training="one jax.jit of the jax:jit step over a mesh of every process's device: the global batch sharded "
        "along it (each process gives its rows), parameters, optimizer state and batch-norm state replicated; the loss "
        "is the global batch's, so XLA's partitioner inserts the gradient all-reduces (GSPMD, no explicit psum) and "
        "batch norm's statistics are the global batch's",
        dtypes=("fp32", "bf16"),
        compile_s=1.0,
        distributed="N worker processes on disjoint cores; jax.distributed.initialize with the coordinator bound to "
        "127.0.0.1 (coordinator_bind_address) and gloo CPU collectives on 127.0.0.1 (jaxlib's gloo factory given the "
        "address)",
        global_batch_norm=True,
    )
)
register_runtime(
    RuntimeInfo(
        name="tensorflow:multiworker",
        module=builtin_module("tensorflow", "backend"),
        requires=("tensorflow",),
        description="data-parallel training: tf.distribute.MultiWorkerMirroredStrategy, RING collectives, a custom loop "
        "(phase training only; --procs)",
        phases=("training",),
        training="one tf.function: strategy.run of the replica step on the worker's rows (the global weight sum "
        "all-reduced, forward + loss under tf.GradientTape, the gradients all-reduced (SUM) in one call, the global "
        "loss), then a Keras 3 optimizer's apply_gradients on the worker's variables",
        dtypes=("fp32", "bf16"),
        startup_s=5.5,
        compile_s=1.0,
        distributed="N worker processes on disjoint cores; TF_CONFIG built by fwbench (workers at 127.0.0.1 on free "
        "ports); TensorFlow's gRPC servers bind every interface (0.0.0.0, not configurable)",
    )
)
register_runtime(
    RuntimeInfo(
        name="keras:jax-dataparallel",
        module=builtin_module("keras", "backend"),
        requires=("keras", "jax"),
        description="data-parallel training: Keras 3 keras.distribution.DataParallel on the JAX backend, one process per device "
        "(phase training only; --procs)",
        phases=("training",),
        training=KERAS_TRAINING + "the keras:jax step under a DataParallel distribution: variables replicated, "
        "train_on_batch given the process's rows, which Keras makes the global batch; XLA all-reduces the gradients",
        dtypes=("fp32", "bf16"),
        extras=("keras", "jax"),
        startup_s=6.0,
        compile_s=1.0,
        distributed="N worker processes on disjoint cores; joined as jax:distributed (coordinator and gloo on 127.0.0.1), "
        "then keras.distribution.set_distribution(DataParallel(list_devices(), auto_shard_dataset=False))",
        global_batch_norm=True,
    )
)
register_runtime(
    RuntimeInfo(
        name="horovod:torch",
        module=builtin_module("horovod", "backend"),
        requires=("horovod",),
        description="Horovod's ring all-reduce over torch (listed for completeness)",
        phases=("training",),
        training="hvd.DistributedOptimizer around torch.optim",
        dtypes=("fp32", "bf16"),
        distributed="horovodrun",
        unavailable="Horovod's last release (0.28.1, 2023) does not build against torch 2.13, TensorFlow 2.21 or "
        "current compilers; torch:ddp and tensorflow:multiworker run the same ring all-reduce",
    )
)
# Phase serving: the harness's floor, and the native model servers this machine cannot run.
register_runtime(
    RuntimeInfo(
        name="floor:identity",
        module=builtin_module("floor", "backend"),
        requires=("numpy",),
        model_files=False,
        description="phase serving only: a model whose outputs are its inputs, through the same server, batcher and "
        "load generator: what the harness alone costs",
        phases=("serving",),
        extras=("serving",),
        startup_s=1.0,
    )
)
register_runtime(
    RuntimeInfo(
        name="torchserve:torch",
        module=builtin_module("torchserve", "backend"),
        requires=("ts", "model_archiver", "torch"),
        description="phase serving only: TorchServe as it ships (its Java frontend, queue and batching, one Python "
        "model worker) serving our torch model (torch:eager's, the same weights) archived with torch-model-archiver",
        note="TorchServe is in limited maintenance upstream (pytorch/serve#3396); needs a JDK (java on PATH)",
        phases=("serving",),
        package=builtin_package("torch"),
        extras=("serving", "torch"),
        startup_s=6.0,  # archiving, the JVM, the model worker's torch import and build: 3.8 s measured (2 cores)
    )
)
register_runtime(
    RuntimeInfo(
        name="tfserving:tensorflow",
        module="",
        requires=(),
        description="TensorFlow Serving's model server",
        phases=("serving",),
        unavailable="no TensorFlow Serving server installs here: none on PyPI or Debian (tensorflow-serving-api is "
        "the client only)",
    )
)
register_runtime(
    RuntimeInfo(
        name="triton:onnxruntime",
        module="",
        requires=(),
        description="NVIDIA Triton Inference Server with its ONNX Runtime backend",
        phases=("serving",),
        unavailable="tritonserver needs Python 3.12 or later and glibc 2.39 (this machine: Python 3.11); "
        "nvidia-pytriton needs numpy below 2",
    )
)

TFJS_NOTE = (
    "Node.js, one thread: TF.js runs its WebAssembly backend single-threaded in Node.js (tensorflow/tfjs#3830), "
    "and its plain JavaScript backend always; the cell's --threads is its CPU pinning only"
)
for _mode, _description, _share in (
    # share: 4-17 GFLOP/s and 0.2-0.7 GFLOP/s measured on a 2-core Xeon (docs/runtimes.md)
    (
        "wasm",
        "WebAssembly backend (XNNPACK kernels, SIMD): the models written in TF.js ops, each call under tf.tidy",
        0.15,
    ),
    ("cpu", "its plain JavaScript backend (the slow reference: no SIMD, no native code)", 0.008),
):
    register_runtime(
        RuntimeInfo(
            name=f"tfjs:{_mode}",
            module="",
            requires=(),
            description=f"TensorFlow.js 4.22 in Node.js, {_description}",
            note=TFJS_NOTE,
            external="fwbench.frameworks.tfjs.external",
            startup_s=1.5,
            throughput_share=_share,
            threads_used=1,
            phases=("inference", "generate"),
        )
    )

register_runtime(
    RuntimeInfo(
        name="tfjs:wasm-browser",
        module="",
        requires=(),
        description="TensorFlow.js 4.22's WebAssembly backend in a cross-origin-isolated page of headless Chromium "
        "(threads, SIMD), the same model files and weights as tfjs:wasm",
        note="its wasm thread pool asked for --threads (what the page got, SIMD, isolation and performance.now()'s "
        "resolution in details.browser; a shortfall is flagged); peak memory: Chromium's processes and the Node.js "
        "worker's summed; phase inference only so far (no generate yet); fwbench verify and diff run their one "
        "call in the page",
        external="fwbench.frameworks.tfjs.external_browser",
        startup_s=3.0,
        throughput_share=0.15,
        phases=("inference",),
        no_generate="not built yet in the page: tfjs:wasm runs the same generate.mjs in Node.js",
    )
)

LOADER_DESCRIPTION = "an input pipeline (phase data only): one timed call is the next batch out of the loader"
LOADER_NOTE = (
    "its worker processes inherit the cell worker's CPU affinity (its --threads cores) and share them, none "
    "pinned to a core of its own"
)
register_runtime(
    RuntimeInfo(
        name="torch:dataloader",
        module=builtin_module("torch", "data"),
        requires=("torch", "PIL"),
        description=LOADER_DESCRIPTION,
        note=LOADER_NOTE,
        phases=("data",),
        data="torch.utils.data.DataLoader(num_workers=W, prefetch_factor=2, persistent_workers=True) over a map-style "
        "Dataset that decodes each JPEG with Pillow and resizes with F.interpolate (bilinear, no antialiasing); "
        "batches NCHW; W=0 decodes in the cell's process",
    )
)
register_runtime(
    RuntimeInfo(
        name="tensorflow:data",
        module=builtin_module("tensorflow", "data"),
        requires=("tensorflow",),
        packed="TFRecord shards",
        description=LOADER_DESCRIPTION,
        note=LOADER_NOTE,
        phases=("data",),
        data="tf.data: file paths (or, with --data-source packed, the TFRecord shards read by interleave) → "
        "map(read, decode_jpeg INTEGER_ACCURATE, crop, tf.image.resize bilinear, flip, normalise; num_parallel_calls=W, "
        "deterministic; W=0: AUTOTUNE, what a plain map becomes by tf.data's default map_parallelization) → batch → "
        "prefetch(AUTOTUNE); W are threads in the cell's process; batches NHWC",
        startup_s=5.5,
    )
)
register_runtime(
    RuntimeInfo(
        name="grain:dataloader",
        module=builtin_module("grain", "data"),
        requires=("grain", "array_record", "PIL"),
        packed="ArrayRecord files",
        description=LOADER_DESCRIPTION,
        note=LOADER_NOTE,
        phases=("data",),
        data="grain.DataLoader(worker_count=W, worker_buffer_size=2) over the files (or, with --data-source packed, the "
        "ArrayRecord files), an IndexSampler in file order, map transforms decoding with Pillow and the numpy "
        "reference transforms; batches NHWC; W=0 decodes in the cell's process",
        extras=("data",),
        startup_s=3.0,
    )
)

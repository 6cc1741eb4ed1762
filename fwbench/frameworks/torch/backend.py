"""PyTorch backend. Modes:

- ``eager``: the nn.Module, called under ``torch.inference_mode()``;
- ``script``: ``torch.jit.trace`` on the cell's inputs, then ``torch.jit.freeze`` (the 2019 study's
  TorchScript; deprecated upstream since PyTorch 2.9, whose warnings are left as they are);
- ``compile``: ``torch.compile(fullgraph=True, mode=settings.compile_mode)`` with inductor; compilation
  happens in the first call;
- ``export``: ``torch.export.export`` on the cell's inputs, compiled ahead of time by AOTInductor
  (``aoti_compile_and_package``) into a ``.pt2`` package in a temporary folder, loaded back with
  ``aoti_load_package``; the loaded runner is the timed callable. Everything happens in ``compile``.

bf16 (``dtype="bf16"``): every mode traces, compiles or calls the model wrapped in :class:`Autocast`,
whose forward runs under ``torch.autocast(device, dtype=torch.bfloat16)``: weights and inputs stay
float32, autocast runs matmuls and convolutions in bfloat16 and the rest as its op lists say (so
residual sums can stay float32). TorchScript records the casts when tracing and ``torch.export``
keeps the autocast region, so the compiled modes compute in bfloat16 too (a process-wide autocast
would not reach an exported graph). Outputs come back as autocast leaves them (bfloat16 or float32);
``to_numpy`` converts them to float32, outside the timed call.
"""

from __future__ import annotations

import functools
import os
import tempfile
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any, ClassVar

import numpy as np
import torch

from fwbench.frameworks.base import Backend, Decoder, export_report
from fwbench.frameworks.roles import TrainingArch, as_training_arch
from fwbench.frameworks.torch import precision
from fwbench.spec import Settings


class Autocast(torch.nn.Module):
    """``inner`` called under ``torch.autocast(device_type, dtype=torch.bfloat16)``: same inputs and
    outputs, matmuls and convolutions in bfloat16."""

    def __init__(self, inner: torch.nn.Module, device_type: str) -> None:
        super().__init__()
        self.inner = inner
        self.device_type = device_type

    def forward(self, *inputs: torch.Tensor) -> Any:
        with torch.autocast(self.device_type, dtype=torch.bfloat16):
            return self.inner(*inputs)


class Tapped(torch.nn.Module):
    """``inner`` called with a checkpoint collector (fwbench.models.checkpoints): returns (its outputs, the
    checkpoints by name); what every mode traces, compiles or calls for ``fwbench diff``."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, *inputs: torch.Tensor) -> tuple[Any, dict[str, torch.Tensor]]:
        taps: dict[str, torch.Tensor] = {}
        return self.inner(*inputs, taps=taps), taps


def dynamo_counters() -> dict[str, int]:
    """torch.compile's process-wide, cumulative counts: graphs compiled, graph breaks, frames left to eager."""
    from torch._dynamo.utils import counters

    frames = counters["frames"]  # counted only for frames that may break the graph (not under fullgraph)
    return {
        "compiles": int(counters["stats"]["unique_graphs"]),  # graphs captured: the first and every recompile
        "graph_breaks": int(sum(counters["graph_break"].values())),
        "eager_fallbacks": int(frames["total"] - frames["ok"]),  # e.g. the recompile limit was hit
    }


class TorchBackend(Backend):
    framework = "torch"
    # lightning: phase fit only (fit.py); ddp, ddp-compile: phase training as one of N ranks (distributed.py)
    modes: ClassVar[tuple[str, ...]] = ("eager", "script", "compile", "export", "lightning", "ddp", "ddp-compile")
    _export_signature: tuple[tuple[tuple[int, ...], str, str], ...] | None = None  # shapes the runner is for
    _export_log: tuple[dict[str, Any], ...] = ()  # one entry per export + AOT compile, in order

    def configure_threads(self, intra_op: int, inter_op: int) -> dict[str, int]:
        torch.set_num_threads(intra_op)
        try:
            torch.set_num_interop_threads(inter_op)
        except RuntimeError:  # already set once in this process; report what is in force
            pass
        return {"intra_op": torch.get_num_threads(), "inter_op": torch.get_num_interop_threads()}

    def configure_precision(self) -> dict[str, object]:
        torch.set_float32_matmul_precision("highest")
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        return {
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "cuda_matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
            "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),  # ATen's kernels: DEFAULT, AVX2, AVX512
            **(
                {
                    "bf16_mechanism": f"torch.autocast({self.device}, bfloat16) around the forward; "
                    "float32 weights and inputs"
                }
                if self.dtype == "bf16"
                else {}
            ),
        }

    def make_inputs(self, arrays: dict[str, np.ndarray]) -> tuple[torch.Tensor, ...]:
        return tuple(torch.from_numpy(np.ascontiguousarray(a)).to(self.device) for a in arrays.values())

    def _enter_inference_mode(self) -> None:
        """One worker runs one inference cell, so autograd is switched off for the whole process: no per-call
        context manager inside the timed loop."""
        if not hasattr(self, "_inference_mode"):
            self._inference_mode = torch.inference_mode()
            self._inference_mode.__enter__()

    def compile(self, inputs: Sequence[Any]) -> None:
        self._enter_inference_mode()
        if self.mode == "script":
            traced = torch.jit.trace(self._module(), tuple(inputs), check_trace=False)
            self._forward = torch.jit.freeze(traced)
        elif self.mode == "compile":
            self._forward = torch.compile(self._module(), fullgraph=True, mode=self.settings.compile_mode)
        elif self.mode == "export":
            self._forward = self._export_and_load(inputs)
        else:
            self._forward = self._module()

    def _module(self, inner: torch.nn.Module | None = None) -> torch.nn.Module:
        """What the mode traces, compiles or calls: the model (or ``inner``) for fp32, under autocast for bf16."""
        inner = self.model if inner is None else inner
        return Autocast(inner, self.device).eval() if self.dtype == "bf16" else inner

    def observe_precision(self, inputs: Sequence[Any]) -> dict[str, list[str]] | None:
        """The op classes' operand dtypes as dispatched in one eager call of what every mode traces (the model,
        under autocast for bf16), in eval mode so a training cell's running statistics stay untouched."""
        if self.model is None:
            return None
        was_training = self.model.training
        self.model.eval()
        try:
            return precision.observed_dtypes(self._module(), inputs)
        finally:
            self.model.train(was_training)

    def _export_and_load(self, inputs: Sequence[torch.Tensor]) -> Callable[..., Any]:
        """``torch.export`` → AOTInductor ``.pt2`` package → loaded runner, specialised to these input
        shapes; the runner already loaded is reused when the shapes, dtypes and devices are unchanged.

        Exported inside the worker's ``torch.inference_mode()`` like every other mode (torch 2.13
        exports and AOT-compiles there; parameters are plain tensors made before it was entered).
        The generated kernels bake in ``torch.get_num_threads()`` of compile time, which the thread
        budget has set by then. The package folder is deleted once loaded: the runner keeps its
        own extracted copy (removed by torch when the runner is freed)."""
        signature = tuple((tuple(t.shape), str(t.dtype), str(t.device)) for t in inputs)
        if signature == self._export_signature:
            return self._forward
        with tempfile.TemporaryDirectory(prefix="fwbench-aoti-") as folder:
            return self._package_and_load(inputs, os.path.join(folder, "model.pt2"))

    def save_artefact(self, inputs: Sequence[Any], path: str) -> dict[str, Any]:
        """export: the AOTInductor package written to ``path`` (which must end in ``.pt2``) and loaded from there."""
        if self.mode != "export":
            return super().save_artefact(inputs, path)
        self._enter_inference_mode()  # as the timed path exports
        self._forward = self._package_and_load(inputs, path)
        return dict(self._export_log[-1])

    def _package_and_load(self, inputs: Sequence[torch.Tensor], path: str) -> Callable[..., Any]:
        """``torch.export`` of the module on ``inputs``, AOT-compiled into the package ``path``, loaded."""
        signature = tuple((tuple(t.shape), str(t.dtype), str(t.device)) for t in inputs)
        started = time.perf_counter()
        exported = torch.export.export(self._module(), tuple(inputs))
        exported_at = time.perf_counter()
        package = torch._inductor.aoti_compile_and_package(exported, package_path=path)
        compiled_at = time.perf_counter()
        package_bytes = os.path.getsize(package)
        runner = torch._inductor.aoti_load_package(package)
        del exported
        self._export_signature = signature
        self._export_log = (
            *self._export_log,
            {
                "input_shapes": [list(shape) for shape, _, _ in signature],
                "export_s": exported_at - started,
                "aot_compile_s": compiled_at - exported_at,
                "load_s": time.perf_counter() - compiled_at,
                "package_bytes": package_bytes,
            },
        )
        return runner

    def infer(self, inputs: Sequence[Any]) -> tuple[torch.Tensor, ...]:
        return self._forward(*inputs)

    def checkpoints(self, inputs: Sequence[Any]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """The model wrapped in :class:`Tapped`, then as the mode makes its program: called (eager), traced and
        frozen (script), ``torch.compile``d (compile) or exported and AOT-compiled into a package of its own
        (export); one call."""
        self._enter_inference_mode()
        tapped = self._module(Tapped(self.model).eval())
        program: Callable[..., Any] = tapped
        if self.mode == "script":
            program = torch.jit.freeze(torch.jit.trace(tapped, tuple(inputs), check_trace=False, strict=False))
        elif self.mode == "compile":
            program = torch.compile(tapped, fullgraph=True, mode=self.settings.compile_mode)
        elif self.mode == "export":
            with tempfile.TemporaryDirectory(prefix="fwbench-aoti-") as folder:
                exported = torch.export.export(tapped, tuple(inputs))
                package = torch._inductor.aoti_compile_and_package(
                    exported, package_path=os.path.join(folder, "tapped.pt2")
                )
                program = torch._inductor.aoti_load_package(package)
        outputs, taps = program(*inputs)
        captured = {name: t.detach().float().cpu().numpy() for name, t in taps.items()}
        return self.to_numpy(outputs), self.canonical_checkpoints(captured)

    def make_decoder(self, batch: int, prompt_len: int, new_tokens: int) -> Decoder:
        """eager or compile (generate.DecodeProgram)."""
        if self.mode not in ("eager", "compile"):
            return super().make_decoder(batch, prompt_len, new_tokens)
        max_len = prompt_len + new_tokens
        from fwbench.frameworks.torch.generate import DecodeProgram

        self._enter_inference_mode()
        return DecodeProgram(
            self.arch_module(), self.model, batch, max_len, self.mode, self.settings.compile_mode, dtype=self.dtype
        )

    def sync(self, outputs: Any) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    def make_step(self, inputs: Sequence[Any]) -> Callable[[], object]:
        if self.device == "cpu":  # CPU kernels finish before the call returns: nothing to wait for
            return functools.partial(self._forward, *inputs)
        return super().make_step(inputs)

    def to_numpy(self, outputs: Sequence[torch.Tensor]) -> dict[str, np.ndarray]:
        assert self.description is not None
        return {name: t.detach().float().cpu().numpy() for name, t in zip(self.description.output_names, outputs)}

    # -- phase training -----------------------------------------------------------------------
    def make_targets(self, arrays: dict[str, np.ndarray]) -> tuple[torch.Tensor, ...]:
        """(labels int64, label_weights float32) on the device: F.cross_entropy takes int64 class ids."""
        labels, weights = self.make_inputs(arrays)
        return labels.long(), weights

    def make_train_step(self, inputs: Sequence[Any], targets: Sequence[Any]) -> Callable[[], object]:
        """eager: zero_grad, forward + loss, backward, optimizer step, all eager. compile: forward + loss
        compiled as one ``torch.compile(fullgraph=True, mode=compile_mode)`` graph (AOTAutograd compiles
        its backward as well, which ``loss.backward()`` runs), and the optimizer step compiled by a second
        ``torch.compile`` (PyTorch's recipe for compiled optimizers; the step cannot join the first graph,
        ``backward`` runs between them). Autograd is on: training never enters inference_mode. bf16: the
        forward under ``torch.autocast(device, bfloat16)``, the loss in float32 of the float32-cast logits;
        parameters, gradients and optimizer state stay float32 (the master weights)."""
        if self.mode not in ("eager", "compile", "ddp", "ddp-compile"):
            raise NotImplementedError(f"torch:{self.mode} has no training phase yet")
        assert self.description is not None
        from fwbench.frameworks.torch import training
        from fwbench.frameworks.torch.weights import variable_names
        from fwbench.models.training import optimizer_spec

        arch = as_training_arch(self.arch_module())
        # The description says which canonical tensors are frozen; the weight map, which parameters hold them.
        frozen_names = variable_names(self.model, self.description.frozen_in_training())
        # train(): batch norm (ResNet) normalises with batch statistics and updates its running buffers
        # (momentum 0.1, unbiased running variance: nn.BatchNorm2d's defaults); no model here has dropout.
        model = self.model.train()
        trained = self._trained_parameters(model, frozen_names)
        optimizer = training.make_optimizer(optimizer_spec(self.settings.optimizer), trained)
        if self.mode in ("ddp", "ddp-compile"):
            from fwbench.frameworks.torch import distributed

            return distributed.make_train_step(self, arch, model, optimizer, inputs, targets)
        return self._one_process_step(arch, model, optimizer, inputs, targets)

    def _trained_parameters(self, model: torch.nn.Module, frozen_names: Collection[str]) -> list[torch.nn.Parameter]:
        """``model``'s parameters but ``frozen_names``, in order, which alone require gradients; ValueError unless
        they are as many as the description's trained tensors."""
        assert self.description is not None
        trained = []
        for name, parameter in model.named_parameters():  # buffers (running statistics) are not parameters
            frozen = name in frozen_names
            parameter.requires_grad_(not frozen)
            if not frozen:
                trained.append(parameter)
        expected = self.description.trained_tensor_count()
        if len(trained) != expected:
            raise ValueError(f"{len(trained)} trained parameters, expected {expected}")
        return trained

    def _one_process_step(
        self,
        arch: TrainingArch,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        inputs: Sequence[Any],
        targets: Sequence[Any],
    ) -> Callable[[], object]:
        """The train step of eager and compile (:meth:`make_train_step`): zero_grad, forward + loss (under
        autocast in bf16), backward, optimizer step (compile: the forward + loss and the optimizer step each
        ``torch.compile``-d), returning the detached loss."""
        from fwbench.frameworks.torch import training

        logits_of, loss_of = arch.training_logits, training.weighted_cross_entropy
        labels, weights = targets
        autocast = self.dtype == "bf16"  # mixed precision: float32 parameters (the master weights) and optimizer
        device_type = self.device

        def forward_loss(*batch: torch.Tensor) -> torch.Tensor:
            if not autocast:
                return loss_of(logits_of(model, *batch), labels, weights)
            with torch.autocast(device_type, dtype=torch.bfloat16):  # matmuls, convolutions in bfloat16
                logits = logits_of(model, *batch)
            return loss_of(logits.float(), labels, weights)  # the loss in float32, outside autocast

        def optimizer_step() -> None:
            optimizer.step()

        if self.mode == "compile":
            forward_loss = torch.compile(forward_loss, fullgraph=True, mode=self.settings.compile_mode)
            optimizer_step = torch.compile(optimizer_step, fullgraph=False, mode=self.settings.compile_mode)
        on_cuda = self.device == "cuda"

        def step() -> torch.Tensor:
            optimizer.zero_grad(set_to_none=True)
            loss = forward_loss(*inputs)
            loss.backward()
            optimizer_step()
            if on_cuda:
                torch.cuda.synchronize()
            return loss.detach()

        return step

    def gradient_arrays(self, inputs: Sequence[Any], targets: Sequence[Any]) -> tuple[object, list[np.ndarray]]:
        """eager, compile: one step of :meth:`make_train_step` (the timed step, compiled forward and backward for
        compile), then each parameter's ``.grad``: the gradients that step applied."""
        if self.mode not in ("eager", "compile"):
            return super().gradient_arrays(inputs, targets)
        from fwbench.frameworks.torch.weights import gradient_arrays

        loss = self.make_train_step(inputs, targets)()
        return loss, gradient_arrays(self.model)

    def allreduce_seconds(self, elements: int, repeats: int) -> list[float]:
        if self.mode not in ("ddp", "ddp-compile"):
            return super().allreduce_seconds(elements, repeats)
        from fwbench.frameworks.torch import distributed

        return distributed.allreduce_seconds(elements, repeats, self.device)

    def barrier(self) -> None:
        if self.mode not in ("ddp", "ddp-compile"):
            super().barrier()
        import torch.distributed as dist

        dist.barrier()

    def kernel_libraries(self, step: Callable[[], object], inputs: Sequence[Any]) -> list[dict[str, Any]]:
        """oneMKL's and oneDNN's verbose reports of one more call, ATen's and inductor's ISA (torch/kernels.py)."""
        from fwbench.frameworks.torch import kernels

        return kernels.kernel_libraries(step, self.mode, self.device)

    def compile_counters(self) -> dict[str, int]:
        if self.mode not in ("compile", "ddp-compile"):  # eager runs no compiler; script and export compile earlier
            return {}
        return dynamo_counters()

    def compile_report(self) -> dict[str, Any]:
        """export: seconds of ``torch.export``, of the AOTInductor compile and of loading the package
        for the timed shapes; ``reexports`` lists the same for other shapes compiled later (parity)."""
        return export_report(self._export_log)

    def reset_peak_memory(self) -> None:
        if self.device == "cuda":
            torch.cuda.reset_peak_memory_stats()

    def memory_stats(self) -> dict[str, int | None]:
        if self.device == "cuda":
            return {"allocator_peak_bytes": int(torch.cuda.max_memory_allocated())}
        return {"allocator_peak_bytes": None}

    def versions(self) -> dict[str, str]:
        return {"torch": torch.__version__, "mkldnn": str(torch.backends.mkldnn.is_available())}

    def is_oom(self, exc: BaseException) -> bool:
        if isinstance(exc, torch.OutOfMemoryError):
            return True
        return super().is_oom(exc) or (isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc))


def create_backend(
    mode: str, device: str, settings: Settings, *, dtype: str = "fp32", phase: str = "inference"
) -> TorchBackend:
    return TorchBackend(mode, device, settings, dtype=dtype, phase=phase)

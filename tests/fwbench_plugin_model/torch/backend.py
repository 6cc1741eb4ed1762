"""The plugin framework's backend: PyTorch's eager backend; its model files are this package's (the registry
entry's ``package`` tells ``fwbench.frameworks.create_backend``)."""

from __future__ import annotations

from fwbench.frameworks.torch.backend import TorchBackend
from fwbench.spec import Settings


def create_backend(
    mode: str, device: str, settings: Settings, *, dtype: str = "fp32", phase: str = "inference"
) -> TorchBackend:
    if mode != "torch":
        raise ValueError(f"pluginfw has no mode {mode!r}")
    return TorchBackend("eager", device, settings, dtype=dtype, phase=phase)

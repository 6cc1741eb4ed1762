"""The plugin framework's weights module: PyTorch's (``fwbench.frameworks.base.WeightsModule``)."""

from __future__ import annotations

from fwbench.frameworks.torch.weights import parameter_arrays

__all__ = ["parameter_arrays"]

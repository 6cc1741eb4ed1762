"""The plugin's JAX model files (``plugin_mlp.py``), used by the built-in jax:jit runtime."""

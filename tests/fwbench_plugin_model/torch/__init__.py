"""The plugin's PyTorch framework package: model files (``plugin_mlp.py``), ``weights.py`` and ``backend.py``."""

"""The manager (never imports a framework) and the worker (one fresh interpreter per cell)."""

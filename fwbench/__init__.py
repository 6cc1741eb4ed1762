"""fwbench: benchmark deep-learning frameworks against each other, honestly."""

__version__ = "0.1.0"

"""Seeded datasets for the data phase, written without network and without a framework: JPEG images with labels
(:mod:`fwbench.datasets.images`) and text lines with a vocabulary tokenizer (:mod:`fwbench.datasets.text`), each
folder described by its ``manifest.json`` (:mod:`fwbench.datasets.manifest`). Same arguments, same bytes."""

"""Runtime ``torchserve:torch``: our torch model served by TorchServe as it ships (phase serving only).

The model (fwbench's torch model file, the cell's weights) is archived with torch-model-archiver together with
fwbench's handler (:mod:`.handler`); TorchServe's Java frontend and its Python model worker serve it with
TorchServe's own HTTP stack, queue and batching, set to the cell's max batch size and max delay, its threads set
to the cell's budget (:mod:`.server`). The load generator drives it like fwbench's server.
"""

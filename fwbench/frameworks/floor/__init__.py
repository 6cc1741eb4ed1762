"""The harness's floor, ``floor:identity`` (phase serving): a backend that computes nothing (:mod:`.backend`)."""

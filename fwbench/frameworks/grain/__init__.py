"""Grain (the JAX ecosystem's data loader): the data phase's ``grain:dataloader`` pipeline (:mod:`.data`)."""

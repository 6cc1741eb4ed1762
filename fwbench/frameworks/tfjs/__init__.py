"""TensorFlow.js in Node.js (runtimes ``tfjs:wasm`` and ``tfjs:cpu``): the models written in TF.js ops
(``<arch>.mjs``), timed by a worker written in JavaScript (``worker.mjs``) that speaks fwbench's worker protocol
(docs/architecture.md, "A worker in another language").

The Python modules here never import a framework: :mod:`.external` says whether Node.js and the pinned packages
(``package.json``, ``package-lock.json``, installed into ``node_modules`` here by ``scripts/ensure-node-packages``)
are there, and writes what the JavaScript worker reads that only Python computes: the seeded weights, the inputs,
the model's structure and the float64 reference.
"""

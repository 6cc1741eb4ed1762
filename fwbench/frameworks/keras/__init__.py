"""Keras 3: one model per architecture, built from keras layers and keras.ops, run on the tensorflow,
jax or torch Keras backend (``keras:<backend>``; the backend is chosen in ``backend.py`` before keras
is imported)."""

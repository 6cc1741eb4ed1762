"""LiteRT (TFLite): the engine running TensorFlow's TFLite conversion of our models (``litert:tensorflow``)."""

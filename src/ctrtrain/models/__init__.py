"""Models (DeepFM) and sparse-aware optimizers, on tf.Module + tf.Variable (no Keras)."""

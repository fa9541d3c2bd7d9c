"""tf.data input pipelines: sources, vectorized parsing, the transformation order."""

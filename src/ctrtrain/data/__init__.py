"""Data layer: formats, featurization, conversion, validation, synthesis and splitting."""

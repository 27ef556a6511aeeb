"""A trained run as a forecaster: sampled price paths, ensembles, export and ONNX inference."""

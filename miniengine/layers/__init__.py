"""Layers the engine plugs in around the model: the sampler (and, in milestone 7, quantized linears)."""

"""Tensor parallelism: sharded layers, communicators, the rank launcher."""

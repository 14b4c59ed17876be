"""Plain jax.numpy models; the same code is the reference (`Par()`) and the shard_map body."""

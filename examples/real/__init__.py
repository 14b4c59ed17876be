"""Real models (GPT-2, Llama-3, Qwen2, MoE) with their sharded training and inference programs.

`models/` holds the jax.numpy models, written once and parametrised by a `Par` (which mesh axes
do what); `catalog.py` builds the corpus of (reference, shard_map program) pairs, correct and
buggy; `bugs.py` holds the buggy twins (one `# BUG` line each).
"""

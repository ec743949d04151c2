"""The reference model: the tiny causal LM, the Markov corpus and its sampler, and the reference loop
with checkpoints and rewind."""

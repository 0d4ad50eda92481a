"""Speculative decoding: pure sampling/acceptance functions, verify-length policies, the batched engine."""

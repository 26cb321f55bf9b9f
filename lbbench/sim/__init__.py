"""Simulated vLLM instances and the cluster event loop (virtual time)."""

"""lbbench: trace-replay benchmarking harness for LLM load balancers."""

__version__ = "0.1.0"

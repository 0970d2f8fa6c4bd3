"""The GPU suite's parts (benchmarks/gpu_suite.py is the entry point)."""

"""Benchmarks: `make bench` (python -m benchmarks.run). One `bench_*.py` module per area."""

"""Benchmark scripts (README.md); each runs as a script and imports as `benchmarks.<name>`."""

"""Benchmarks of the outbox relay: `python -m bench --help` (docs/benchmark.md)."""

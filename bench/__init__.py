"""Benchmarks of the outbox relay: `python -m bench --help` (see docs/readme/benchmark.md)."""

"""Benchmarks of the outbox relay: `python -m bench --help` (see the README, section Benchmark)."""

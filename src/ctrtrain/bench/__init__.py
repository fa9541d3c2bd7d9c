"""Benchmarks: measured throughput, median of repeats, with the machine described."""

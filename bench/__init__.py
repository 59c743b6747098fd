"""Benchmarks: each script prints a table and writes bench/results/<name>.json."""

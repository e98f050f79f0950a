"""Benchmarks (`make bench`, i.e. `python -m benchmarks`): ratios measured side by side, not tests."""

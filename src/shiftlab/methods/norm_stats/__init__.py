"""The norm_stats method folder (spec.py: no torch; method.py: the torch code)."""

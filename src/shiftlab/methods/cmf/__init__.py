"""The cmf method folder (spec.py: no torch; method.py: the torch code)."""

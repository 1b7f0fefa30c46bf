"""The roid method folder (spec.py: no torch; method.py: the torch code)."""

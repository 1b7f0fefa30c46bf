"""The fab_t attack folder (spec.py: no torch; attack.py: the torch code)."""

"""The difftpt method folder (spec.py and views_folder.py: no torch; method.py: the torch code)."""

"""Kept for the drivers written before tools/golden/harness.py, which now holds the per-variant command line."""
from harness import checkout_commit, variants_main  # noqa: F401

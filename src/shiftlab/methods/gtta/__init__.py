"""The gtta method folder (spec.py only: GTTA is registered and refused; README.md says why)."""

"""TCA: token condensation as training-free test-time adaptation (spec.py, method.py)."""

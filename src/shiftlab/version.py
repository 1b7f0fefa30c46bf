"""The package version: one definition, read by the package root, run.json and `shiftlab --version`."""
__version__ = "0.1.0"

"""CALIP: parameter-free attention between the image tower's spatial tokens and the class features (AAAI 2023)."""

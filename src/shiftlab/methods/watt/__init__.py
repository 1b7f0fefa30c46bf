"""WATT: weight averaging of the image tower's norm parameters adapted under several text templates."""

"""Machinery several methods share: the confident-view selection, the online methods' state checks."""

"""SANTA: source anchoring (cross-entropy of the batch and its augmentation to the source model), source-free."""

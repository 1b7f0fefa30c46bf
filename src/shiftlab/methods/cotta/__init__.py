"""CoTTA: continual TTA with a mean teacher, augmentation-averaged pseudo-labels and stochastic restore."""

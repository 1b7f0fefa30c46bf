"""CoTTA: continual test-time adaptation with a mean teacher, augmentation-averaged pseudo-labels and stochastic restore."""

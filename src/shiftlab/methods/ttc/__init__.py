"""TTC: test-time counterattacks, a training-free defence of CLIP's image tower (CVPR 2025)."""

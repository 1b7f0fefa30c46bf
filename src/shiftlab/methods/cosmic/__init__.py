"""COSMIC (Huang et al., CVPR 2025): training-free online TTA over CLIP and DINOv2 caches with clique graphs."""

"""SCAP (Zhou et al., CVPR 2025): supportive clique-based attribute prompting over batches of test images."""

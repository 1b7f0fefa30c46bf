"""BCA (Zhou et al., CVPR 2025), training-free online Bayesian class adaptation, as TTABC runs it."""

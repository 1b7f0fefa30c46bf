"""LAME (Boudiaf, Mueller, Ben Ayed & Bertinetto, CVPR 2022): output-only Laplacian adjustment of a batch."""

"""CLIP-OT: Sinkhorn pseudo-labels from each template's text features, adapting the tower's LayerNorms."""

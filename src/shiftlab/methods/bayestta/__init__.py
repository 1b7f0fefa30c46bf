"""BayesTTA: class-conditional Gaussians updated along the stream, Gaussian discriminant logits, EMA norm steps."""

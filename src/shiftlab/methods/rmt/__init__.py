"""RMT: robust mean teacher (symmetric cross-entropy to an EMA teacher), source-free on CLIP."""

"""CLIPTTA: contrastive test-time adaptation of CLIP on batches, and its OOD-aware variant."""

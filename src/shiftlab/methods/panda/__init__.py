"""Panda: negative data augmentation (patch mosaics of the batch) debiasing zero-shot CLIP."""

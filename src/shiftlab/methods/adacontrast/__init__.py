"""AdaContrast on CLIP, as CLIPTTA's toolkit runs it."""

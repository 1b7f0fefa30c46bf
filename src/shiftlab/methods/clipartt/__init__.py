"""CLIPArTT: CLIP adapted at test time with soft pseudo-labels from a batch's image and top-K caption similarities."""

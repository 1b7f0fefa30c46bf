"""GS-Bias: global and spatial logit biases tuned per test image (methods/gs_bias/README.md)."""

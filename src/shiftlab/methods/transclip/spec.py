"""TransCLIP (Zanella, Gérin & Ben Ayed, NeurIPS 2024), zero-shot: transductive over the whole test set."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..catalogue.declarations import EPISODIC, FROZEN_FEATURES, Capabilities, MethodConfig, MethodSpec

# github.com/MaxZanella/transduction-for-vlms at 6a9e8f3: TransCLIP_solver/TransCLIP.py, TransCLIP_utils.py


@dataclass
class TransCLIPConfig(MethodConfig):
    # TransCLIP_utils.py get_parameters: lambda_value = 1 in the zero-shot setting (the weight of the zero-shot
    # prediction's log in the z-update)
    lambda_value: float = param(1.0, ge=0)
    n_neighbors: int = param(3, ge=1)           # TransCLIP.py:56 (the Laplacian's k-NN graph)
    iterations: int = param(10, ge=1)           # TransCLIP.py:54 (max_iter: z, mu, sigma block updates)
    z_iterations: int = param(5, ge=1)          # TransCLIP_utils.py update_z(max_iter=5)
    n_confident: int = param(8, ge=1)           # TransCLIP_utils.py init_mu: 8 pseudo-labelled samples per class
    # TransCLIP_utils.py prepare_objects: clip_logits = 100 * features @ prototypes (the literal, not the model's)
    logit_scale: float = param(100.0, gt=0)


class TransCLIPSpec(MethodSpec):
    capabilities = Capabilities(reads=(FROZEN_FEATURES,), state=EPISODIC, reads_ahead="test_set")
    supports_pure_fp16 = True   # their main.py: clip.load(backbone) on CUDA, the half model
    test_config = {"iterations": 2}

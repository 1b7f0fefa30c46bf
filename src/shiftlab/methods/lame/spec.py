"""LAME (Boudiaf, Mueller, Ben Ayed & Bertinetto, CVPR 2022, "Parameter-free Online Test-time Adaptation").

What differs from the authors' code: README.md."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..catalogue.declarations import EPISODIC, FROZEN_FEATURES, Capabilities, MethodConfig, MethodSpec

AFFINITIES = ("knn", "rbf", "linear")


@dataclass
class LAMEConfig(MethodConfig):
    """LAME's defaults as CLIPTTA's CLIP port runs it (MarcLafon/cliptta@f4221f4, `ttavlm/methods/lame.py`,
    `ttavlm/configuration.py`); `--protocol paper` gives the authors' own (fiveai/LAME@d2e5f63). Both codes share
    `laplacian_optimization(unary, kernel, bound_lambda=1, max_steps=100)` and its stopping rule."""
    # configuration.py:215 `--affinity knn`; fiveai's defaults.py:67 LAME_AFFINITY 'rbf'
    affinity: str = param("knn", choices=AFFINITIES)
    # lame.py:38-40 `kNN_affinity(knn=5)` (hard-coded in CLIPTTA); fiveai defaults.py:65 LAME_KNN 5
    knn: int = param(5, ge=1)
    # fiveai defaults.py:68 LAME_FORCE_SYMMETRY False: kernel <- (kernel + kernel^T) / 2 (CLIPTTA has no such option)
    force_symmetry: bool = False
    bound_lambda: float = param(1.0, ge=0)       # laplacian_optimization's default (lame.py:53, fiveai lame.py:125)
    max_steps: int = param(100, ge=1)            # its default (lame.py:54, fiveai lame.py:125)
    # the scale of the unary's logits: CLIPTTA's LAME takes the softmax of the raw cosine similarities
    # (lame.py:34-35: get_logits without its logit_scale, abstract_model.py:186-197); None: the model's
    # exp(logit_scale), the classifier's own probabilities as fiveai's LAME reads them (`out["probas"]`)
    logit_scale: float | None = param(1.0, gt=0)
    # the reported probabilities: None: LAME's assignments Y (fiveai's format_result); a number s: softmax(s Y),
    # what CLIPTTA's get_results scores (abstract_model.py:359-363, `--logit_scale 100`, configuration.py:174);
    # the same argmax
    output_scale: float | None = param(None, gt=0)
    # the scale of its own OOD score, CLIPTTA's get_scores of Y: max softmax(ood_logit_scale x Y) (`--score_type
    # max_prob`, configuration.py:147; `--ood_logit_scale 1.0`, configuration.py:175; abstract_model.py:475-485)
    ood_logit_scale: float = param(1.0, gt=0)
    # CLIPTTA's default template "A photo of a {}." (datasets/utils.py:116; CLIP's tokenizer lowercases it)
    text_head: str = param("zeroshot", choices=("zeroshot", "ensemble"))
    templates: tuple[str, ...] | None = None


class LAMESpec(MethodSpec):
    # one frozen feature per image (view 0), nothing carried from batch to batch, whole batches
    capabilities = Capabilities(reads=(FROZEN_FEATURES,), state=EPISODIC, batches=True)
    test_config = {"max_steps": 20}
    # recorded on open-set runs beside MCM (Lame.forward_and_adapt returns get_scores(Y), lame.py:47)
    own_ood_score = ("CLIPTTA's score of LAME (`ood_logit_scale`: max_prob of its assignments Y at scale 1; "
                     "ttavlm/methods/lame.py forward_and_adapt, abstract_model.py get_scores)")

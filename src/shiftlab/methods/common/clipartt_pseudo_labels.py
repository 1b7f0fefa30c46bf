"""CLIPArTT's pseudo-labels and loss (Hakim, Osowiechi et al., WACV 2025), the machinery its family shares
(CLIPArTT: methods/clipartt/; WATT: methods/watt/): each image's top-K classes make one caption, the soft
targets are the softmax of the batch's image-image and caption-caption similarities, and the loss is the
cross-entropy between the image-caption logits and these targets.

Authors' code: github.com/dosowiechi/CLIPArTT (`models/tent.py`), cited below at 6f439ba.
"""
from __future__ import annotations

import torch


def captions(top: torch.Tensor, classnames: list[str], template: str) -> list[str]:
    """(B, K) class indices -> one caption per image naming its K classes (getprompt, models/tent.py:58-64)."""
    return [template.format(" or ".join(classnames[int(c)] for c in row)) for row in top]


def soft_targets(features: torch.Tensor, captions_features: torch.Tensor, temperature: float,
                 kind: str) -> torch.Tensor:
    """(B, D) image features, (B, D) caption features -> (B, B) targets (models/tent.py:96-111): row-wise softmax of
    (image-image + caption-caption similarity) / 2 / temperature ("both"), of one of them halved, or the identity."""
    if kind == "identity":
        return torch.eye(len(features), device=features.device)
    images, texts = features @ features.T, captions_features @ captions_features.T
    similarity = {"both": (images + texts) / 2, "image": images / 2, "text": texts / 2}[kind]
    return (similarity / temperature).softmax(-1)


def clipartt_loss(features: torch.Tensor, captions_features: torch.Tensor, targets: torch.Tensor, scale: float,
                  transposed: bool) -> torch.Tensor:
    """() the mean over images of -sum_j target_ij log softmax_j(scale x f_i . t_j) (cross_entropy, models/tent.py:
    45-51, 112), with image i's targets column i of `targets` (`transposed`, theirs) or its row i."""
    logits = scale * features @ captions_features.T            # (B images, B captions) = their logits.t()
    weights = targets.T if transposed else targets
    return (-weights * logits.log_softmax(-1)).sum(1).mean()

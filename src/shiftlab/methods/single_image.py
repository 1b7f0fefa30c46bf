"""The library's shortest path: one image in, one readable prediction out.

    import shiftlab
    model = shiftlab.load_model("RN50", pretrained="openai")
    pred = shiftlab.predict("cat.jpg", method="tpt", model=model, classes="imagenet-r")
    pred.name, pred.index, pred.top(3)      # 'tabby cat', 281, [('tabby cat', 0.61), ...]
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..datasets.specs import classnames
from ..models import ClipModel, load_model
from .base import check_model, create_method
from .catalogue.protocols import DEFAULT_PROTOCOL
from .outputs import Prediction


def resolve_classes(classes: str | Sequence[str]) -> list[str]:
    """A dataset name (`shiftlab.classnames`) or a list of class names -> the list."""
    if isinstance(classes, str):
        return classnames(classes)
    if not isinstance(classes, (list, tuple)):
        raise TypeError(f"classes must be a dataset name or a list of class names, got {type(classes).__name__}")
    return list(classes)


def predict(image: Any, method: str = "zeroshot", *, model: ClipModel | str, classes: str | Sequence[str],
            protocol: str = DEFAULT_PROTOCOL, seed: int = 0, **config: Any) -> Prediction:
    """One call: `image` (path, PIL image, uint8 array) classified by `method` among `classes` (a dataset
    name such as "imagenet-r", or a list of class names), with the method's own view recipe.

    `model`: a loaded `ClipModel`, or a model name loaded with OpenAI's weights. `config` overrides the
    method's settings (as in `create_method`). Each call builds the method anew, so an online method
    (TDA, DMN-ZS, ...) starts from an empty memory: keep a `create_method` instance and call its
    `predict_image` to adapt along a stream of images."""
    if isinstance(model, str):
        model = load_model(model, pretrained="openai")
    check_model(model)
    names = resolve_classes(classes)
    return create_method(method, model, names, protocol=protocol, **config).predict_image(image, seed=seed)

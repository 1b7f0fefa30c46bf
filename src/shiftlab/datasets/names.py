"""A dataset's class names without its files: `shiftlab.classnames("imagenet-r")`."""
from __future__ import annotations

from .classes import classnames_for_wnids
from .crossdataset import crossdataset_classnames
from .folders import DATASETS, DatasetError


def classnames(name: str) -> list[str]:
    """The CLIP class names of dataset `name` (or an alias) in label order, as a run of it uses them:
    ImageNet's table for the ImageNet family, CoOp's for the fine-grained sets. `imagefolder` takes
    its names from its folders: build_dataset(name, root).classnames."""
    spec = DATASETS.get(name)
    if spec.layout == "split":
        return crossdataset_classnames(spec.name)
    wnids = spec.wnids()
    if wnids is None:
        raise DatasetError(f"{spec.name}: its class names come from its folders: "
                           "use shiftlab.datasets.build_dataset(name, root).classnames")
    return classnames_for_wnids(wnids)

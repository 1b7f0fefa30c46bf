"""Every dataset shiftlab knows, as one table of `DatasetSpec`s: its layout, names, folder names, class
names (as a data file), download facts and the title of its column in a suite table.

Adding a dataset is one `DatasetSpec(...)` in `_TABLE` below plus its class file under `data/` (see
datasets/classes.py); `build_dataset` then finds it by its layout and what its folder holds, and
`shiftlab datasets`, `shiftlab download`, `shiftlab.classnames` and the suite table read it from here.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..options import name_of
from ..registry import Registry
from .base import DatasetError
from .classes import source_names, source_size, source_wnids

__all__ = ["LAYOUTS", "COOP_DATASETS_MD", "DatasetSpec", "SplitLayout", "DATASETS", "list_datasets", "classnames"]

# Each layout with how `shiftlab datasets` describes it; datasets/build.py picks the loader by it (and,
# for the class-folder layouts, reads CLIP_benchmark's webdataset shards or a Hugging Face table instead
# when the folder holds one).
LAYOUTS = {
    "wnid": "one folder per class named by wnid: <wnid>/*.JPEG",            # label = place in the class list
    "index": "one folder per class named 0..999: <index>/*.jpeg",           # label = int(folder)
    "split": "CoOp's split file (split_zhou_<Name>.json) beside the images",  # datasets/splits.py
    "any": "one folder per class (names sorted; a class-names file for CLIP names)",   # imagefolder
    # folders.py (or, for SVHN, its test_32x32.mat: matfile.py)
    "images": "any images below the folder (SVHN: its test_32x32.mat), no labels: an out-of-distribution set",
    "npy": "CIFAR-C's arrays: <corruption>.npy (severities 1..5 stacked) and labels.npy",   # datasets/corrupted.py
}
COOP_DATASETS_MD = "https://github.com/KaiyangZhou/CoOp/blob/main/DATASETS.md"


@dataclass(frozen=True)
class SplitLayout:
    """Where a split-listed set's test split and images are.

    ``split_file``: CoOp's split file name (None: FGVCAircraft's own ``images_variant_test.txt``);
    ``image_dirs``: candidate image folders relative to the set's folder, the split's paths start
    there; ``test_size``: the number of test images in CoOp's split (another count = another file).
    """

    split_file: str | None
    image_dirs: tuple[str, ...]
    test_size: int


@dataclass(frozen=True, kw_only=True)
class DatasetSpec:
    """What a named dataset looks like on disk and where it comes from.

    ``classes``: where its class names are, a file under ``shiftlab/data`` (``imagenet_classes.tsv``,
    ``imagenet_classes.tsv:in_imagenet_r``, ``classes/<name>.txt``; datasets/classes.py); None: from
    its folders (imagefolder). ``short``: its column title in a suite table, as the papers print it.
    ``aliases``: other names it answers to (case-insensitive, ``_`` = ``-``).
    ``dirnames``: its folder names under a data root, tried nested ones first; ``dirnames[0]`` is the
    one the downloader creates. ``archive_dir``: the top-level folder inside the archive. ``url=None``
    with ``manual`` set means no automatic download (``manual`` may use ``{archive}`` and ``{target}``).
    ``sha256``/``size`` of the archive are None until recorded from a trusted download (datasets/install.py).
    ``split``: where a ``"split"`` layout's test split and images are.
    ``corrupted``: the set holds one dataset per corruption and severity (ImageNet-C's
    ``<corruption>/<severity>/`` folders, CIFAR-C's ``<corruption>.npy``); a run picks one with
    ``--corruption``/``--severity`` (datasets/corrupted.py).
    """

    name: str
    layout: str
    classes: str | None
    short: str = ""
    aliases: tuple[str, ...] = ()
    dirnames: tuple[str, ...] = ()
    url: str | None = None
    archive_name: str | None = None
    archive_dir: str | None = None
    sha256: str | None = None
    size: int | None = None
    manual: str | None = None
    split: SplitLayout | None = None
    corrupted: bool = False

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"{self.name}: layout {self.layout!r} is not one of {', '.join(LAYOUTS)}")
        if (self.layout == "split") != (self.split is not None):
            raise ValueError(f"{self.name}: a 'split' layout needs its SplitLayout, and only it has one")

    def wnids(self) -> list[str] | None:
        """label -> wnid, for datasets whose classes come from ImageNet's table; else None."""
        return source_wnids(self.classes) if self.classes else None

    def classnames(self) -> list[str]:
        """The CLIP class names in label order (DatasetError for imagefolder: its names are its folders')."""
        if self.layout == "images":
            raise DatasetError(f"{self.name} has no classes: it is an out-of-distribution set ({name_of('ood')})")
        if self.classes is None:
            raise DatasetError(f"{self.name}: its class names come from its folders: "
                               "use shiftlab.datasets.build_dataset(name, root).classnames")
        return source_names(self.classes)

    @property
    def num_classes(self) -> int | None:
        return source_size(self.classes) if self.classes else None

    def folder_hint(self, root: Path) -> str:
        """' (expected the class folders there or in ROOT/<folder>; get them with: ...)', or ''."""
        if not self.dirnames:
            return ""
        hint = f" (expected the class folders there or in {root / self.dirnames[0]}"
        if self.url:
            hint += f"; get them with: shiftlab download {self.name} --root {root}"
        return hint + ")"


def _normalize_name(name: str) -> str:
    return name.strip().lower().replace("_", "-")


def _vgg(path: str) -> str:
    return f"https://www.robots.ox.ac.uk/~vgg/data/{path}"


def _manual(what: str) -> str:
    return (what + " Put the result so that {target} holds it (see docs/DATA.md for the layout), "
            "and CoOp's split file next to it (" + COOP_DATASETS_MD + ").")


_SKETCH_MANUAL = (
    "ImageNet-Sketch has no stable direct-download URL (it is hosted on Google Drive, Kaggle "
    "'wanghaohan/imagenetsketch' and the Hugging Face dataset 'imagenet_sketch', which need a login "
    "or a browser). Download ImageNet-Sketch.zip by hand and either put it at {archive} and rerun, "
    "pass it with `shiftlab download imagenet-sketch --url file:///path/to/ImageNet-Sketch.zip`, or unzip it "
    "so that {target}/<wnid>/ holds the images."
)
_IMAGENET_MANUAL = (
    "ImageNet requires an account at image-net.org; it cannot be downloaded automatically. Put the "
    "50,000 validation images into one folder per wnid at {target}/<wnid>/*.JPEG (e.g. with the "
    "widely used valprep.sh script)."
)
_IMAGENET = "imagenet_classes.tsv"
_MOS_OOD = "http://pages.cs.wisc.edu/~huangrui/imagenet_ood_dataset"   # MOS's and MCM's OOD subsets
_IMAGENET_C_MANUAL = (
    "ImageNet-C is five archives (about 65 GB) on Zenodo record 2235448 (https://zenodo.org/records/2235448: "
    "blur.tar, digital.tar, noise.tar, weather.tar, and extra.tar for the four extra corruptions). Extract them "
    "all into {target} so that {target}/<corruption>/<severity>/<wnid>/ holds the images; or generate the "
    "corruptions from any ImageNet-layout folder (`shiftlab run --corruption NAME`; docs/PROTOCOLS.md)."
)

# Names: shiftlab's own; CLIP_benchmark's (imagenet1k, imagenetv2, imagenet_sketch, imagenet_r, flowers, ...)
# and TPT's set ids (I/A/V/R/K, Flower102, ...) as aliases. Folder names: shiftlab's, then the archive's, then
# the layouts of CoOp's DATASETS.md, TPT's ID_to_DIRNAME and CLIP_benchmark's `--dataset_root root/{dataset}`.
# Archive sizes/checksums are not written here: none was published by the authors, so they are recorded
# in <root>/<name>.sha256 on the first trusted download and verified afterwards. Short titles: TPT's tables.
_TABLE = (
    # the ImageNet family (TPT's Table 1)
    DatasetSpec(
        name="imagenet-r", layout="wnid", classes=f"{_IMAGENET}:in_imagenet_r", short="-R",
        aliases=("r", "imagenet-rendition"), dirnames=("imagenet-r", "imagenet-rendition/imagenet-r", "imagenet_r"),
        url="https://people.eecs.berkeley.edu/~hendrycks/imagenet-r.tar",
        archive_name="imagenet-r.tar", archive_dir="imagenet-r"),
    DatasetSpec(
        name="imagenet-a", layout="wnid", classes=f"{_IMAGENET}:in_imagenet_a", short="-A",
        aliases=("a", "imagenet-adversarial"), dirnames=("imagenet-a", "imagenet-adversarial/imagenet-a", "imagenet_a"),
        url="https://people.eecs.berkeley.edu/~hendrycks/imagenet-a.tar",
        archive_name="imagenet-a.tar", archive_dir="imagenet-a"),
    DatasetSpec(
        name="imagenet-v2", layout="index", classes=_IMAGENET, short="-V2",
        aliases=("v", "imagenetv2", "imagenetv2-matched-frequency"),
        dirnames=("imagenet-v2", "imagenetv2-matched-frequency-format-val",
                  "imagenetv2/imagenetv2-matched-frequency-format-val", "imagenetv2/ImageNetV2-matched-frequency",
                  "ImageNetV2-matched-frequency"),
        url="https://huggingface.co/datasets/vaishaal/ImageNetV2/resolve/main/imagenetv2-matched-frequency.tar.gz",
        archive_name="imagenetv2-matched-frequency.tar.gz", archive_dir="imagenetv2-matched-frequency-format-val"),
    DatasetSpec(
        name="imagenet-sketch", layout="wnid", classes=_IMAGENET, short="-Sketch",
        aliases=("k", "imagenet-s", "imagenetsketch"),
        dirnames=("imagenet-sketch", "sketch", "imagenet-sketch/images", "ImageNet-Sketch/sketch", "ImageNet-Sketch",
                  "imagenet_sketch"),
        archive_name="ImageNet-Sketch.zip", archive_dir="sketch", manual=_SKETCH_MANUAL),
    DatasetSpec(
        name="imagenet", layout="wnid", classes=_IMAGENET, short="ImageNet",
        aliases=("i", "imagenet1k", "imagenet-1k", "imagenet-val"),
        dirnames=("imagenet-val", "imagenet/val", "val", "imagenet/images/val", "ImageNet/val", "imagenet1k/val"),
        manual=_IMAGENET_MANUAL),
    DatasetSpec(name="imagefolder", layout="any", classes=None),
    # common corruptions as their authors ship them (Hendrycks & Dietterich, ICLR 2019; datasets/corrupted.py).
    # Zenodo publishes MD5s, not SHA-256: shiftlab records a SHA-256 on the first download (datasets/install.py).
    DatasetSpec(
        name="imagenet-c", layout="wnid", classes=_IMAGENET, short="-C", aliases=("imagenetc",),
        dirnames=("imagenet-c", "ImageNet-C", "imagenet_c"), corrupted=True, manual=_IMAGENET_C_MANUAL),
    DatasetSpec(
        name="cifar10-c", layout="npy", classes="classes/cifar10.txt", short="CIFAR-10-C",
        aliases=("cifar-10-c", "cifar10c"), dirnames=("CIFAR-10-C", "cifar10-c", "cifar-10-c"), corrupted=True,
        url="https://zenodo.org/records/2535967/files/CIFAR-10-C.tar", archive_name="CIFAR-10-C.tar",
        archive_dir="CIFAR-10-C"),
    DatasetSpec(
        name="cifar100-c", layout="npy", classes="classes/cifar100.txt", short="CIFAR-100-C",
        aliases=("cifar-100-c", "cifar100c"), dirnames=("CIFAR-100-C", "cifar100-c", "cifar-100-c"), corrupted=True,
        url="https://zenodo.org/records/3555552/files/CIFAR-100-C.tar", archive_name="CIFAR-100-C.tar",
        archive_dir="CIFAR-100-C"),
    # out-of-distribution sets for open-set runs (--ood; datasets/openset.py): MCM's four ImageNet OOD sets (the
    # curated subsets of MOS, Huang & Li 2021, hosted by its authors), NINCO (Bitterwolf et al., ICML 2023), SVHN
    DatasetSpec(
        name="inaturalist-ood", layout="images", classes=None, short="iNaturalist", aliases=("inaturalist",),
        dirnames=("iNaturalist/images", "iNaturalist", "inaturalist"),
        url=f"{_MOS_OOD}/iNaturalist.tar.gz", archive_name="iNaturalist.tar.gz", archive_dir="iNaturalist"),
    DatasetSpec(
        name="sun-ood", layout="images", classes=None, short="SUN", dirnames=("SUN/images", "SUN", "sun-ood"),
        url=f"{_MOS_OOD}/SUN.tar.gz", archive_name="SUN.tar.gz", archive_dir="SUN"),
    DatasetSpec(
        name="places-ood", layout="images", classes=None, short="Places", aliases=("places",),
        dirnames=("Places/images", "Places", "places-ood"),
        url=f"{_MOS_OOD}/Places.tar.gz", archive_name="Places.tar.gz", archive_dir="Places"),
    DatasetSpec(
        name="textures-ood", layout="images", classes=None, short="Textures", aliases=("textures",),
        dirnames=("dtd/images", "dtd/dtd/images", "Textures", "textures"),
        url=_vgg("dtd/download/dtd-r1.0.1.tar.gz"), archive_name="dtd-r1.0.1.tar.gz", archive_dir="dtd/images"),
    DatasetSpec(
        name="ninco", layout="images", classes=None, short="NINCO",
        dirnames=("NINCO/NINCO_OOD_classes", "NINCO_OOD_classes", "NINCO", "ninco"),
        manual="NINCO is distributed by its authors (github.com/j-cb/NINCO, Zenodo): download NINCO_all.tar.gz and "
               "extract it so that {target} holds NINCO_OOD_classes/<class>/*.jpg (64 classes, 5,879 images)."),
    DatasetSpec(
        name="svhn", layout="images", classes=None, short="SVHN", dirnames=("svhn", "SVHN"),
        manual="SVHN's test split is distributed as test_32x32.mat (ufldl.stanford.edu/housenumbers/test_32x32.mat, "
               "26,032 images): put it at {target}/test_32x32.mat (read with scipy: pip install 'shiftlab[svhn]'), "
               "or its images as files under {target}."),
    # the ten cross-dataset sets with CoOp's test splits (TPT's Table 2); folders: CoOp's, TPT's, CLIP_benchmark's
    DatasetSpec(
        name="flowers102", layout="split", classes="classes/flowers102.txt", short="Flowers102",
        aliases=("flowers", "flower102", "oxford-flowers", "oxfordflowers", "flowers-102"),
        dirnames=("oxford_flowers", "Flower102", "flowers", "flowers102"),
        url=_vgg("flowers/102/102flowers.tgz"), archive_name="102flowers.tgz",
        split=SplitLayout("split_zhou_OxfordFlowers.json", ("jpg", "flowers-102/jpg", ""), 2463)),
    DatasetSpec(
        name="dtd", layout="split", classes="classes/dtd.txt", short="DTD",
        aliases=("describabletextures", "describable-textures"), dirnames=("dtd", "DTD"),
        url=_vgg("dtd/download/dtd-r1.0.1.tar.gz"), archive_name="dtd-r1.0.1.tar.gz",
        split=SplitLayout("split_zhou_DescribableTextures.json", ("images", "dtd/images", "dtd/dtd/images", ""), 1692)),
    DatasetSpec(
        name="oxford-pets", layout="split", classes="classes/oxford-pets.txt", short="Pets",
        aliases=("pets", "oxfordpets", "oxford-iiit-pet"), dirnames=("oxford_pets", "OxfordPets", "pets"),
        url=_vgg("pets/data/images.tar.gz"), archive_name="oxford_pets_images.tar.gz",
        split=SplitLayout("split_zhou_OxfordPets.json", ("images", "oxford-iiit-pet/images", ""), 3669)),
    DatasetSpec(
        name="stanford-cars", layout="split", classes="classes/stanford-cars.txt", short="Cars",
        aliases=("cars", "stanfordcars"), dirnames=("stanford_cars", "StanfordCars", "cars"),
        manual=_manual("Stanford Cars' original download (ai.stanford.edu/~jkrause/cars) is offline; "
                       "get cars_test/ (8,041 images) from a mirror such as Kaggle's "
                       "'jessicali9530/stanford-cars-dataset'."),
        split=SplitLayout("split_zhou_StanfordCars.json", ("", "stanford_cars"), 8041)),
    DatasetSpec(
        name="ucf101", layout="split", classes="classes/ucf101.txt", short="UCF101",
        aliases=("ucf-101",), dirnames=("ucf101", "UCF101"),
        manual=_manual("UCF101 is used as CoOp's middle frames of each video: download "
                       "UCF-101-midframes.zip from the Google Drive link in CoOp's DATASETS.md and unzip it."),
        split=SplitLayout("split_zhou_UCF101.json", ("UCF-101-midframes", ""), 3783)),
    DatasetSpec(
        name="caltech101", layout="split", classes="classes/caltech101.txt", short="Caltech101",
        aliases=("caltech-101",), dirnames=("caltech-101", "Caltech101", "caltech101"),
        manual=_manual("Caltech101 is published as a zip holding another archive "
                       "(data.caltech.edu/records/mzrjq-6wc02): extract 101_ObjectCategories.tar.gz from it."),
        split=SplitLayout("split_zhou_Caltech101.json",
                          ("101_ObjectCategories", "caltech101/101_ObjectCategories", ""), 2465)),
    DatasetSpec(
        name="food101", layout="split", classes="classes/food101.txt", short="Food101",
        aliases=("food-101",), dirnames=("food-101", "Food101", "food101"),
        url="http://data.vision.ee.ethz.ch/cvl/food-101.tar.gz", archive_name="food-101.tar.gz",
        split=SplitLayout("split_zhou_Food101.json", ("images", "food-101/images", ""), 30300)),
    DatasetSpec(
        name="sun397", layout="split", classes="classes/sun397.txt", short="SUN397",
        aliases=("sun-397",), dirnames=("sun397", "SUN397"),
        url="http://vision.princeton.edu/projects/2010/SUN/SUN397.tar.gz", archive_name="SUN397.tar.gz",
        split=SplitLayout("split_zhou_SUN397.json", ("SUN397", ""), 19850)),
    DatasetSpec(
        name="fgvc-aircraft", layout="split", classes="classes/fgvc-aircraft.txt", short="Aircraft",
        aliases=("aircraft", "fgvcaircraft"), dirnames=("fgvc_aircraft", "fgvc-aircraft-2013b/data", "fgvc-aircraft"),
        url=_vgg("fgvc-aircraft/archives/fgvc-aircraft-2013b.tar.gz"), archive_name="fgvc-aircraft-2013b.tar.gz",
        split=SplitLayout(None, ("", "fgvc-aircraft-2013b/data", "data"), 3333)),
    DatasetSpec(
        name="eurosat", layout="split", classes="classes/eurosat.txt", short="EuroSAT",
        aliases=("euro-sat",), dirnames=("eurosat", "EuroSAT"),
        url="https://huggingface.co/datasets/torchgeo/eurosat/resolve/"
            "c877bcd43f099cd0196738f714544e355477f3fd/EuroSAT.zip", archive_name="EuroSAT.zip",
        split=SplitLayout("split_zhou_EuroSAT.json", ("2750", "eurosat/2750", ""), 8100)),
)

DATASETS: Registry[DatasetSpec] = Registry("dataset", error=DatasetError, normalize=_normalize_name)
for _spec in _TABLE:
    DATASETS.register(_spec.name, _spec, aliases=_spec.aliases)


def list_datasets() -> list[str]:
    """Names accepted by ``build_dataset``, sorted."""
    return DATASETS.names()


def classnames(name: str) -> list[str]:
    """The CLIP class names of dataset `name` (or an alias) in label order, as a run of it uses them:
    ImageNet's table for the ImageNet family, TPT's lists for the fine-grained sets. `imagefolder` takes
    its names from its folders: build_dataset(name, root).classnames."""
    return DATASETS.get(name).classnames()

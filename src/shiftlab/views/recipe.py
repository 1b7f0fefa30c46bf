"""A method's view recipe as data (count, crop scale, ratio and interpolation, flip, AugMix, Cutout), with no
torch import: the CLI checks `--set METHOD.views=...` with it before loading anything. shiftlab.views draws the
views; it re-exports `ViewRecipe`."""
from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass
from typing import Any

INTERPOLATIONS = ("bilinear", "bicubic")
# fields added after the first release, with their defaults (`ViewRecipe.to_dict` leaves them out at these)
LATER_FIELDS: dict[str, Any] = {"interpolation": "bilinear", "cutout": 0.0, "cutout_p": 1.0}


@dataclass(frozen=True)
class ViewRecipe:
    """How a method's views are made; the image size comes from the model (`ViewConfig`).

    View 0 is always the original; views 1..n_views-1 are RandomResizedCrop(scale, ratio)
    [+ horizontal flip] [+ AugMix] [or Cutout]. Recipes that differ only in `n_views` draw the same
    views in the same order, so a shorter one is a prefix of a longer one (the engine
    generates and encodes the longest once).

    Cutout (DeVries & Taylor 2017, as TIPPLE's `data/datautils.py:181` draws it): one square of side
    `cutout` x the view size, centred on a uniformly drawn pixel and clipped at the border, set to black;
    with probability `cutout_p` a view is cut out, and a cut-out view skips AugMix (TIPPLE's strong views:
    AugMix(severity 4) or, half the time, Cutout(56 px at 224) instead).
    """
    n_views: int = 64
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip: bool = True
    augmix: bool = False          # TPT's AugMix on the augmented views (C-TPT's --I_augmix, TDA)
    augmix_severity: float = 1
    augmix_width: int = 3
    interpolation: str = "bilinear"   # of the crop's resize: "bilinear" (torchvision's default) or "bicubic"
    cutout: float = 0.0               # the Cutout square's side as a fraction of the view size; 0: none
    cutout_p: float = 1.0             # the probability that a view is cut out (instead of AugMix'd)

    def __post_init__(self) -> None:
        # lists (from JSON or --set) become tuples, so recipes stay hashable and compare equal
        object.__setattr__(self, "scale", tuple(float(v) for v in self.scale))
        object.__setattr__(self, "ratio", tuple(float(v) for v in self.ratio))
        object.__setattr__(self, "cutout", float(self.cutout))
        object.__setattr__(self, "cutout_p", float(self.cutout_p))
        # a bool is not a count (True would be one view), nor is 1.5
        if isinstance(self.n_views, bool) or not isinstance(self.n_views, numbers.Integral) or self.n_views < 1:
            raise ValueError(f"views: n_views must be an integer >= 1, got {self.n_views!r}")
        object.__setattr__(self, "n_views", int(self.n_views))
        if len(self.scale) != 2 or not 0 < self.scale[0] <= self.scale[1] <= 1:
            raise ValueError(f"views: scale must be (low, high) with 0 < low <= high <= 1, got {self.scale}")
        if len(self.ratio) != 2 or not 0 < self.ratio[0] <= self.ratio[1] < math.inf:
            raise ValueError(f"views: ratio must be (low, high) with 0 < low <= high, finite, got {self.ratio}")
        if self.augmix and not (math.inf > self.augmix_severity >= 0.1 and self.augmix_width >= 1):
            raise ValueError("views: augmix_severity must be >= 0.1 and augmix_width >= 1, got "
                             f"{self.augmix_severity} and {self.augmix_width}")

        if self.interpolation not in INTERPOLATIONS:
            raise ValueError(f"views: interpolation must be one of {', '.join(INTERPOLATIONS)}, "
                             f"got {self.interpolation!r}")
        if not 0 <= self.cutout <= 1 or not 0 <= self.cutout_p <= 1:
            raise ValueError(f"views: cutout and cutout_p must be in [0, 1], got {self.cutout} and {self.cutout_p}")

    def with_views(self, n_views: int) -> ViewRecipe:
        return dataclasses.replace(self, n_views=n_views)

    @property
    def family(self) -> ViewRecipe:
        """The recipe with the view count left out: equal families draw identical view sequences."""
        return dataclasses.replace(self, n_views=1)

    def to_dict(self) -> dict[str, Any]:
        """The fields; those added after the first release only where they differ from their default, so
        the recipes written before them (run.json, feature-store keys) read and key as they did."""
        out = dataclasses.asdict(self)
        for name, default in LATER_FIELDS.items():
            if out.get(name) == default:
                del out[name]
        return out

    def describe(self) -> str:
        """One line, e.g. '64 views: RandomResizedCrop(scale 0.08-1) + flip + AugMix(severity 1)'."""
        if self.n_views == 1:
            return "view 0 only (resize + centre crop)"
        how = "" if self.interpolation == "bilinear" else f", {self.interpolation}"
        parts = [f"RandomResizedCrop(scale {self.scale[0]:g}-{self.scale[1]:g}{how})"]
        if self.flip:
            parts.append("flip")
        if self.augmix:
            parts.append(f"AugMix(severity {self.augmix_severity:g}, width {self.augmix_width})")
        if self.cutout:
            cut = f"Cutout({self.cutout:g} of the side)"
            parts.append(cut if self.cutout_p == 1 else f"{cut} with p {self.cutout_p:g}"
                         + (" instead of AugMix" if self.augmix else ""))
        return f"{self.n_views} views: original + {self.n_views - 1} x " + " + ".join(parts)

    @classmethod
    def coerce(cls, value: Any, base: ViewRecipe | None = None) -> ViewRecipe:
        """A recipe from a recipe, a dict of fields (merged onto `base`) or a view count."""
        base = base if base is not None else cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, bool):
            raise ValueError(f"views must be a view count or a dict of recipe fields, got {value!r}")
        if isinstance(value, int):
            return dataclasses.replace(base, n_views=value)
        if isinstance(value, dict):
            known = {f.name for f in dataclasses.fields(cls)}
            unknown = sorted(set(value) - known)
            if unknown:
                raise ValueError(f"views: unknown recipe field(s) {unknown}; known: {sorted(known)}")
            return dataclasses.replace(base, **value)
        raise ValueError(f"views must be a view count or a dict of recipe fields, got {value!r}")

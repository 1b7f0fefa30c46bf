"""A family variant is its spec plus ONE class on the family's base (issue #39, "Done when"): in a scratch copy of
the package, an episodic prompt-tuning variant (TPT plus one loss term) and an online cache method (TDA's positive
cache alone, on methods/common/tda_cache.py), each a folder of a minimal spec, its facts as data (card.toml) and a
method.py of at most 60 lines,
are listed, run on the tiny CLIP and give what they should (the extra term at weight 0: exactly TPT's logits; the
cache method at gain 1: exactly TDA's without its negative cache; its state round-trips), touching no other file."""
from __future__ import annotations

import ast
import json
import subprocess

import pytest
from test_scratch_method import _checkout, _shiftlab

VARIANT_SPEC = '''"""Scratch: TPT plus one loss term (a test's variant). Its spec, without torch."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..common.prompt_tuning_config import PromptTuningConfig, PromptTuningSpec
from ..catalogue.declarations import EPISODIC, FROZEN_FEATURES, Capabilities


@dataclass
class TPTConfidenceConfig(PromptTuningConfig):
    weight: float = param(0.0, ge=0)   # a test's own: no source


class TPTConfidenceSpec(PromptTuningSpec):
    name = "tpt_confidence"
    impl = "shiftlab.methods.tpt_confidence.method:TPTConfidence"
    config_class = TPTConfidenceConfig
    capabilities = Capabilities(reads=(FROZEN_FEATURES,), state=EPISODIC)
'''
VARIANT = '''"""Scratch: TPT plus one loss term (a test's variant)."""
from __future__ import annotations

import torch

from ..common.prompt_tuning import PromptTuning
from ..kinds import EpisodicMethod
from .spec import TPTConfidenceSpec


class TPTConfidence(PromptTuning, EpisodicMethod):
    """TPT's marginal entropy + weight x the mean top probability of the selected views."""
    spec = TPTConfidenceSpec

    def loss(self, selected_logits: torch.Tensor, text_features: torch.Tensor) -> tuple[torch.Tensor, dict]:
        entropy, extras = super().loss(selected_logits, text_features)
        confidence = selected_logits.softmax(-1).amax(-1).mean(-1)   # (B,)
        return entropy + self.config.weight * confidence, {**extras, "confidence": confidence}
'''
CACHE_SPEC = '''"""Scratch: TDA's positive cache alone, times a gain (a test's online method): its spec."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..common.tda_cache_config import TDAConfig
from ..catalogue.declarations import FROZEN_FEATURES, ONLINE, Capabilities, MethodSpec


@dataclass
class PositiveCacheConfig(TDAConfig):
    gain: float = param(1.0, ge=0)   # a test's own: no source


class PositiveCacheSpec(MethodSpec):
    name = "positive_cache"
    impl = "shiftlab.methods.positive_cache.method:PositiveCache"
    config_class = PositiveCacheConfig
    capabilities = Capabilities(reads=(FROZEN_FEATURES,), state=ONLINE)
'''
CACHE = '''"""Scratch: TDA's positive cache alone, times a gain (a test's online method)."""
from __future__ import annotations

import torch

from ..common.tda_cache import CacheEntry, TDACacheMethod, TDASample, cache_logits, update_cache
from .spec import PositiveCacheSpec


class PositiveCache(TDACacheMethod):
    """Each sample joins the positive cache under its pseudo-label; logits + gain x the cache's logits."""
    spec = PositiveCacheSpec

    def update(self, s: TDASample) -> None:
        update_cache(self.pos_cache, s.pred, CacheEntry(s.feature, s.loss), self.config.pos_capacity)
        self.seen += 1

    def readout(self, s: TDASample, pos_cache: dict | None = None) -> torch.Tensor:
        cfg = self.config
        if not self.pos_cache:
            return s.logits.clone()
        cached = cache_logits(s.feature, self.pos_cache, cfg.pos_alpha, cfg.pos_beta, len(self.classnames))
        return s.logits + cfg.gain * cached
'''
# their facts as data (docs/METHOD_CARDS.md)
VARIANT_CARD = '''[tpt_confidence]
summary = "tpt_confidence: TPT + weight x the selected views' mean top probability"
fidelity = "a test's variant"
'''
CACHE_CARD = '''[positive_cache]
summary = "positive_cache: zero-shot + gain x TDA's positive cache (online)"
fidelity = "a test's online method"
'''
FOLDERS = {"tpt_confidence": {"spec.py": VARIANT_SPEC, "card.toml": VARIANT_CARD, "method.py": VARIANT},
           "positive_cache": {"spec.py": CACHE_SPEC, "card.toml": CACHE_CARD, "method.py": CACHE}}

LIBRARY = """
import json, torch
import shiftlab
from shiftlab.synthetic import tiny_clip
model, names = tiny_clip(), ["cat", "dog", "fox", "owl"]
size = model.image_size
gen = torch.Generator().manual_seed(0)
views = [model.normalize(torch.rand(4, 3, size, size, generator=gen)) for _ in range(6)]
tuned = dict(views=4, steps=2, selection_ratio=0.5)
tpt = shiftlab.create_method("tpt", model, names, **tuned).predict(views[0])
at_zero = shiftlab.create_method("tpt_confidence", model, names, weight=0.0, **tuned).predict(views[0])
weighted = shiftlab.create_method("tpt_confidence", model, names, weight=50.0, **tuned).predict(views[0])
cache = dict(views=4, text_head="zeroshot", pos_capacity=4)
pos = shiftlab.create_method("positive_cache", model, names, **cache)
tda = shiftlab.create_method("tda", model, names, neg_capacity=0, **cache)
as_tda = all(torch.equal(pos.predict(v), tda.predict(v)) for v in views[:4])
state = pos.state_dict()
resumed = shiftlab.create_method("positive_cache", model, names, **cache)
resumed.load_state_dict(state)
print(json.dumps({
    "summaries": {n: shiftlab.methods.catalogue.declarations.spec(n).summary for n in ("tpt_confidence",
                                                                                     "positive_cache")},
    "listed": {n: shiftlab.methods.catalogue.declarations.spec(n).kind() for n in shiftlab.list_methods() if "_c" in n},
    "kinds": [type(m).__mro__[2].__name__ for m in (resumed, shiftlab.create_method("tpt_confidence", model, names))],
    "variant_at_0_is_tpt": bool(torch.equal(at_zero, tpt)), "term_moves": not bool(torch.equal(weighted, tpt)),
    "cache_as_tda": as_tda, "seen": state["seen"], "entries": len(state["positive"]["labels"]),
    "version": state["version"], "round_trip": all(bool(torch.equal(resumed.predict(v), pos.predict(v)))
                                                    for v in views[4:])}))
"""


@pytest.mark.slow
def test_a_family_variant_is_a_spec_and_one_class(tmp_path):
    root = _checkout(tmp_path / "checkout")
    methods = root / "src" / "shiftlab" / "methods"
    for folder, files in FOLDERS.items():
        (methods / folder).mkdir()
        (methods / folder / "__init__.py").write_text("")
        for name, text in files.items():
            (methods / folder / name).write_text(text)
        tree = ast.parse(files["method.py"])
        assert len(files["method.py"].splitlines()) <= 60, folder
        assert [type(node).__name__ for node in tree.body if isinstance(node, ast.ClassDef)] == ["ClassDef"], folder

    library = _shiftlab(root, code=LIBRARY)
    assert library.returncode == 0, library.stderr
    assert json.loads(library.stdout) == {
        "summaries": {"tpt_confidence": "tpt_confidence: TPT + weight x the selected views' mean top probability",
                      "positive_cache": "positive_cache: zero-shot + gain x TDA's positive cache (online)"},
        "listed": {"positive_cache": "online", "tpt_confidence": "episodic"},
        "kinds": ["OnlineMethod", "EpisodicMethod"], "variant_at_0_is_tpt": True, "term_moves": True,
        "cache_as_tda": True, "seen": 4, "entries": 4, "version": 1, "round_trip": True}

    status = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=all"],
                            capture_output=True, text=True, check=True).stdout.splitlines()
    assert sorted(status) == sorted(f"?? src/shiftlab/methods/{folder}/{name}" for folder, files in FOLDERS.items()
                                    for name in ("__init__.py", *files))

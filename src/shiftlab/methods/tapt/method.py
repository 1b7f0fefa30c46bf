"""TAPT-V: test-time adversarial prompt tuning of deep visual prompts, as `test_time_adv_adapt_eval` and
`test_time_adv_tuning` compute it (github.com/xinwong/TAPT@14d8d0e, trainers/adv_v.py:879-1031).

Per image (episodic: every image starts from the same prompts), its N views (view 0 the image), the loop of
methods/common/token_alignment.py:

1. the views through the ViT with the deep prompts (methods/common/deep_visual_prompts.py) against the fixed
   "a photo of a {}." head: logits (N, C) and every block's input tokens;
2. on the first step, the int(N * selection_ratio) lowest-entropy views for the entropy and the
   int(N * align_ratio) for the statistics (their later steps read the latter for both);
3. loss = marginal entropy of the selected views + align_weight / (to - from) * (gamma * A(adv) + (1 - gamma) *
   A(clean)), A the sum over blocks l in range(from, to - 1) of 0.5 |mean_l - m_l|_1 + 0.5 |var_l - v_l|_1
   (means over elements), mean_l / var_l the selected views' per-token mean and biased variance at block l's
   input, (m, v) the stored statistics (`onestage_align_loss`, adv_v.py:1065-1096);
4. an AdamW step on the prompts; after `steps` steps, view 0's logits with the tuned prompts.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ..common.deep_visual_prompts import (
    dataset_statistics,
    initial_prompts,
    load_vpt_checkpoint,
    prompt_layers,
    prompted_forward,
)
from ..common.token_alignment import TokenAlignmentTuning, TokenStatistics, align_loss
from ..kinds import EpisodicMethod
from .spec import TAPTSpec

Statistics = TokenStatistics   # the name its scripts import from here
# the statistics files' config fields, in the order `loaded_weights` lists them
STATISTICS = ("means_adv", "vars_adv", "means_clean", "vars_clean")


class _Twice:
    """An iterable that calls `make` afresh on each pass (dataset_statistics reads its batches twice)."""

    def __init__(self, make: Callable[[], Iterator[list[torch.Tensor]]]):
        self.make = make

    def __iter__(self) -> Iterator[list[torch.Tensor]]:
        return self.make()


def save_statistics(stats: Statistics, folder: str | Path, tower: str, variant: str, split: str = "train") -> None:
    """Write `stats` as their files: `V_means_{tower}_{split}_{variant}.pt` and `V_vars_...` (e.g. tower "vitb16",
    variant "adv" or "clean"), what the four path settings read."""
    import io

    from ...writes import make_dirs, write_file
    folder = make_dirs(folder)
    for kind, tensor in (("means", stats.means), ("vars", stats.vars)):
        buffer = io.BytesIO()   # serialised in memory: the bytes reach the disk through shiftlab.writes
        torch.save(tensor.detach().cpu().contiguous(), buffer)
        write_file(folder / f"V_{kind}_{tower}_{split}_{variant}.pt", buffer.getvalue())


class TAPT(TokenAlignmentTuning, EpisodicMethod):
    """Tune deep visual prompts per image on its confident views (entropy + token-statistics alignment)."""
    spec = TAPTSpec

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        cfg = self.config
        visual = self.model.clip.visual
        layers = prompt_layers(visual, cfg.depth)
        self.loaded = (None if cfg.prompts is None else
                       load_vpt_checkpoint(cfg.prompts, layers, cfg.n_ctx, visual.conv1.out_channels,
                                           self.trust_checkpoint))
        drawn = initial_prompts(visual, cfg.depth, cfg.n_ctx, cfg.seed)
        self.initial = (self.loaded if self.loaded is not None and cfg.keep_loaded_prompts else drawn)
        self.initial = self.initial.to(self.model.device)
        self.targets = self.load_targets()

    def set_initial_prompts(self, prompts: torch.Tensor) -> None:
        """Start every image from `prompts` (layers, n_ctx, width) instead of the drawn ones."""
        if prompts.shape != self.initial.shape:
            raise ValueError(f"tapt: initial prompts must have shape {tuple(self.initial.shape)}")
        self.initial = prompts.detach().to(self.initial).clone()

    def forward(self, views: torch.Tensor, prompts: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Normalised views (N, 3, S, S) -> (N, C) logits and the blocks' inputs, with `prompts`."""
        with self.precision.autocast():
            out = prompted_forward(self.model.clip.visual, views.to(self.model.input_dtype), prompts)
        feats = F.normalize(out.features.float(), dim=-1)
        return self.model.logit_scale * feats @ self.heads.zeroshot.float().T, out.block_inputs

    def alignment(self, out: Statistics, layers: range) -> torch.Tensor:
        """gamma * A(adv) + (1 - gamma) * A(clean) (module docstring, 3)."""
        cfg = self.config
        return (cfg.gamma * align_loss(out, self.targets["adv"], layers, cfg.align_type)
                + (1 - cfg.gamma) * align_loss(out, self.targets["clean"], layers, cfg.align_type))

    def token_statistics(self, image_batches: Iterable[torch.Tensor],
                         prompts: torch.Tensor | None = None) -> Statistics:
        """The statistics files' values over a data set of normalised image batches (N, 3, S, S), with `prompts`
        (default: the initial ones; theirs: the trained prompts of --model-dir), as their `--eval-only` run
        computes them (`save_and_compute_means` / `_var`, adv_v.py:1174-1271): per block input, token and channel,
        the mean over images and the unbiased variance. Their adversarial files are the same computation on
        adversarial images."""
        prompts = self.initial if prompts is None else prompts
        batches = list(image_batches)

        def block_inputs() -> Iterator[list[torch.Tensor]]:
            for x in batches:
                with torch.no_grad(), self.precision.autocast():
                    yield prompted_forward(self.model.clip.visual, x.to(self.model.input_dtype), prompts).block_inputs
        return Statistics(*dataset_statistics(_Twice(block_inputs)))

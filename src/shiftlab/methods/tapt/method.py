"""TAPT-V: test-time adversarial prompt tuning of deep visual prompts, as `test_time_adv_adapt_eval` and
`test_time_adv_tuning` compute it (github.com/xinwong/TAPT@14d8d0e, trainers/adv_v.py:879-1031).

Per image (episodic: every image starts from the same prompts), its N views (view 0 the image):

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

import hashlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from ..base import MethodOutput
from ..common.confidence import entropy, lowest, marginal_entropy_as_tpt
from ..common.deep_visual_prompts import (
    dataset_statistics,
    initial_prompts,
    load_statistics,
    load_vpt_checkpoint,
    prompt_layers,
    prompted_forward,
    view_statistics,
)
from ..context import SampleContext
from ..kinds import EpisodicMethod
from .spec import TAPTSpec

LOSS_SCALE = 1000.0   # torch.cuda.amp.GradScaler(init_scale=1000) (adv_v.py:867), under fp16 only
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


class Statistics(NamedTuple):
    means: torch.Tensor    # (blocks, L, width)
    vars: torch.Tensor


def align_loss(out: Statistics, target: Statistics, layers: range, kind: str = "l1") -> torch.Tensor:
    """Sum over `layers` of 0.5 d(mean) + 0.5 d(var), d the mean absolute (l1) or squared (l2) difference."""
    distance = F.l1_loss if kind == "l1" else F.mse_loss
    total = out.means.new_zeros(())
    for layer in layers:
        total = total + 0.5 * distance(out.means[layer], target.means[layer].to(out.means)) \
            + 0.5 * distance(out.vars[layer], target.vars[layer].to(out.vars))
    return total


class TAPT(EpisodicMethod):
    """Tune deep visual prompts per image on its confident views (entropy + token-statistics alignment)."""
    spec = TAPTSpec

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        cfg = self.config
        visual = self.model.clip.visual
        self.blocks = len(visual.transformer.resblocks)
        width = visual.conv1.out_channels
        if cfg.align and not cfg.align_layer_from < cfg.align_layer_to - 1 <= self.blocks:
            raise ValueError(f"tapt: align_layer_from={cfg.align_layer_from} and align_layer_to={cfg.align_layer_to} "
                             f"must give blocks range(from, to - 1) inside the tower's {self.blocks}")
        layers = prompt_layers(visual, cfg.depth)
        self.loaded = (None if cfg.prompts is None else
                       load_vpt_checkpoint(cfg.prompts, layers, cfg.n_ctx, width))
        drawn = initial_prompts(visual, cfg.depth, cfg.n_ctx, cfg.seed)
        self.initial = (self.loaded if self.loaded is not None and cfg.keep_loaded_prompts else drawn)
        self.initial = self.initial.to(self.model.device)
        tokens = visual.positional_embedding.shape[0] + cfg.n_ctx
        self.targets: dict[str, Statistics] = {}
        if cfg.align:
            missing = [f for f in STATISTICS if getattr(cfg, f) is None]
            if missing:
                raise ValueError(f"tapt aligns token statistics: set {', '.join(missing)} (their "
                                 "V_{means,vars}_..._{adv,clean}.pt files), or align=False")
            values = {f: load_statistics(getattr(cfg, f), self.blocks, tokens, width).to(self.model.device)
                      for f in STATISTICS}
            self.targets = {"adv": Statistics(values["means_adv"], values["vars_adv"]),
                            "clean": Statistics(values["means_clean"], values["vars_clean"])}

    def loaded_weights(self) -> dict[str, Any]:
        files = [f for f in (*STATISTICS, "prompts") if getattr(self.config, f) is not None]
        return {f"{f}_sha256": hashlib.sha256(Path(getattr(self.config, f)).read_bytes()).hexdigest() for f in files}

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

    def loss(self, logits: torch.Tensor, block_inputs: list[torch.Tensor], entropy_views: torch.Tensor,
             align_views: torch.Tensor) -> torch.Tensor:
        """The step's loss (module docstring, 3) from all views' logits and block inputs."""
        cfg = self.config
        loss = logits.new_zeros(())
        if cfg.entropy_loss:
            loss = marginal_entropy_as_tpt(logits[entropy_views])
        if cfg.align:
            means, variances = view_statistics(block_inputs, align_views)
            out = Statistics(means.float(), variances.float())
            layers = range(cfg.align_layer_from, cfg.align_layer_to - 1)
            both = (cfg.gamma * align_loss(out, self.targets["adv"], layers, cfg.align_type)
                    + (1 - cfg.gamma) * align_loss(out, self.targets["clean"], layers, cfg.align_type))
            loss = loss + cfg.align_weight / (cfg.align_layer_to - cfg.align_layer_from) * both
        return loss

    def select(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(entropy views, alignment views) of the first step: the lowest-entropy views, lowest first."""
        scores = entropy(logits.detach())
        return lowest(scores, self.config.selection_ratio), lowest(scores, self.config.align_ratio)

    def tune(self, views: torch.Tensor) -> tuple[torch.Tensor, list[float]]:
        """The prompts after `steps` AdamW steps from the initial ones on one image's views, and each step's loss."""
        cfg = self.config
        prompts = self.initial.clone().requires_grad_(True)
        optimizer = torch.optim.AdamW([prompts], lr=cfg.lr, weight_decay=cfg.weight_decay)
        scaled = self.precision.loss_scaling
        chosen = None
        losses = []
        for _ in range(cfg.steps):
            with torch.enable_grad():
                logits, inputs = self.forward(views, prompts)
                if chosen is None:
                    chosen = self.select(logits)
                    entropy_views, align_views = chosen
                else:      # their later steps index the outputs with the alignment views (adv_v.py:983-984)
                    entropy_views = align_views = chosen[1]
                loss = self.loss(logits, inputs, entropy_views, align_views)
                losses.append(float(loss.detach()))
                optimizer.zero_grad(set_to_none=True)
                (loss * LOSS_SCALE if scaled else loss).backward()
            if scaled:
                prompts.grad.div_(LOSS_SCALE)
                if not bool(torch.isfinite(prompts.grad).all()):
                    continue       # GradScaler skips the step on overflow
            optimizer.step()
        return prompts.detach(), losses

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

    def predict_context(self, ctx: SampleContext) -> MethodOutput:
        if ctx.views is None:
            raise ValueError("tapt runs its prompts inside the image tower and needs the views' pixels, "
                             "not stored features")
        views = ctx.views.float()
        prompts, losses = self.tune(views)
        with torch.no_grad():
            logits, _ = self.forward(views[:1], prompts)
        return MethodOutput(logits[0], extras={"loss": losses[0]} if losses else {})

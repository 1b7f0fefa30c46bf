"""TTL: test-time low-rank adaptation (Imam et al. 2024, arXiv 2407.15913), episodic.

As the authors' code runs it (github.com/Razaimam45/TTL-Test-Time-Low-Rank-Adaptation at cc754df:
scripts/test_ttl.sh -> ttl.py -> deyo.py, model in clip/custom_clip.py), for every image:

1. LoRA on the query and value projections of the image tower's attention (peft, rank 16,
   alpha 32), trained in the last 3 of ViT-B/16's 12 blocks (`--layer_range 9,11`); A is drawn
   once per run (Xavier normal), B is 0, and both are reset to that before every image;
2. every view's logits against the frozen "a photo of a {}." head; per-view entropy H; the views
   with H <= ln 1000 (all of them for up to 1000 classes) weighted by exp(0.4 - H) (`deyo.py`,
   DeYO's entropy reweighting, their `--deyo_margin_e0 0.4`); the loss is the weighted mean;
3. one AdamW step (lr 5e-3, weight decay 0.01) on the LoRA weights, under fp16 autocast with
   GradScaler(init_scale=1000);
4. view 0 through the adapted tower against the same head.

The tower is `shiftlab.models.lora_tower.LoRATower`: a private module tree over the shared model's own
weights with only its attention swapped for adapted copies, so the shared model is never changed.

What their code never does, and shiftlab does not either: LoRA dropout (0.05 in their config) is
inactive, since the model is in eval mode throughout (ttl.py:312); `--selection_p` is unused on
this path (their `--filter_ent 0`, ttl.py:421, keeps every view with H <= ln 1000, deyo.py:107).
Their image tower is always Hugging Face's ViT-B/16 (`CLIPModel.from_pretrained(
"openai/clip-vit-base-patch16")`, custom_clip.py:581) whatever `--arch` says, so no TTL number
exists for RN50. On a ResNet tower shiftlab adapts the one attention layer it has, the attention
pool (no counterpart in their code); a tower with no attention it knows is refused when the
method is built.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ...models.lora_tower import LoRATower
from ..base import MethodOutput
from ..common.confidence import entropy
from ..context import SampleContext
from ..kinds import EpisodicMethod
from .spec import TTLSpec


def initial_lora(tower: LoRATower, init: str, seed: int) -> dict[str, torch.Tensor]:
    """A drawn with `init` from a CPU generator seeded `seed` (layer by layer, query then value), B = 0."""
    fill = {"xavier": torch.nn.init.xavier_normal_, "gaussian": torch.nn.init.normal_,
            "kaiming": torch.nn.init.kaiming_normal_}[init]
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for key, value in tower.lora_state().items():
        tensor = torch.zeros(value.shape)
        if key.endswith(".A"):
            fill(tensor, generator=gen)
        state[key] = tensor.to(value.device)
    return state


def weighted_entropy_loss(view_logits: torch.Tensor, margin: float, max_entropy: float
                          ) -> tuple[torch.Tensor | None, int]:
    """DeYO's reweighted entropy as TTL runs it: the mean over the views with H <= max_entropy of
    H * 1 / exp(H - margin) (the weight without gradient); (None, 0) when no view qualifies."""
    ent = entropy(view_logits.float())
    kept = ent[ent <= max_entropy]
    if kept.numel() == 0:
        return None, 0
    coeff = 1 / torch.exp(kept.detach() - margin)
    return (kept * coeff).mean(0), int(kept.numel())


class TTL(EpisodicMethod):
    """TTL: LoRA on the image tower's attention, one AdamW step on confidence-weighted view entropy."""
    spec = TTLSpec


    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        cfg = self.config
        try:
            self.tower = LoRATower(self.model.clip, cfg.lora_layers, cfg.rank, cfg.alpha)
        except ValueError as exc:
            raise ValueError(f"ttl: {self.model.name}: {exc}") from None
        self.initial = initial_lora(self.tower, cfg.init, cfg.init_seed)
        self.tower.load_lora_state(self.initial)

    def set_initial_lora(self, state: dict[str, torch.Tensor]) -> None:
        """Start every image from `state` (keys of `LoRATower.lora_state`) instead of the drawn A."""
        expected = self.tower.lora_state()
        if set(state) != set(expected):
            raise ValueError(f"ttl: initial LoRA state must have the keys {sorted(expected)}")
        self.initial = {k: v.detach().to(expected[k].device, expected[k].dtype).clone() for k, v in state.items()}
        self.tower.load_lora_state(self.initial)

    def reset(self) -> None:
        self.tower.load_lora_state(self.initial)

    def _encode(self, views: torch.Tensor) -> torch.Tensor:
        if self.model.channels_last:
            views = views.contiguous(memory_format=torch.channels_last)
        return F.normalize(self.tower(views).float(), dim=-1)

    def _logits(self, views: torch.Tensor) -> torch.Tensor:
        with self.precision.autocast():
            feats = self._encode(views)
        return self.model.logit_scale * feats @ self.heads.zeroshot.T

    def make_optimizer(self, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
        """A fresh AdamW for one image (their optimizer state is reloaded before every image, ttl.py:344)."""
        return torch.optim.AdamW(params, lr=self.config.lr, weight_decay=self.config.weight_decay)

    def adapt(self, views: torch.Tensor) -> dict[str, Any]:
        """The LoRA steps on one image's views (from the initial state); returns the first step's loss
        and how many views it kept. The adapted state is left in the tower."""
        cfg = self.config
        self.reset()
        params = self.tower.lora_parameters()
        optimizer = self.make_optimizer(params)
        scaled = self.precision.loss_scaling
        info: dict[str, Any] = {}
        self.last_losses: list[float] = []      # every step's loss (the first is also in the record's extras)
        for _ in range(cfg.steps):
            with torch.enable_grad():
                loss, kept = weighted_entropy_loss(self._logits(views), cfg.margin, cfg.max_entropy)
                info.setdefault("kept_views", kept)
                if loss is None:     # no view qualifies: their step is skipped, and so is every later one
                    break
                self.last_losses.append(float(loss.detach()))
                info.setdefault("loss", self.last_losses[0])
                optimizer.zero_grad(set_to_none=True)
                (loss * cfg.loss_scale if scaled else loss).backward()
            if scaled:
                for p in params:
                    p.grad.div_(cfg.loss_scale)
                if not all(bool(torch.isfinite(p.grad).all()) for p in params):
                    continue         # GradScaler skips the step on overflow
            optimizer.step()
        return info

    def predict_context(self, ctx: SampleContext) -> MethodOutput:
        if ctx.views is None:
            raise ValueError("ttl tunes the image tower and needs the views' pixels, not stored features")
        try:
            info = self.adapt(ctx.views)
            with torch.no_grad():
                logits = self._logits(ctx.views[:1])[0]
        finally:
            self.reset()
        return MethodOutput(logits.float(), extras=info)

"""The baselines' building blocks (`BaselineMethod`, the authors' helpers written out) and the baselines
of the fixed-head methods and of the TPT family; see the package's docstring."""
from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator, Sequence

import torch

from ...methods.base import MethodConfig
from ...models import ClipModel
from ...models.precision import Precision
from ...models.precision import resolve as resolve_precision

__all__ = ["BaselineMethod", "BaselineUnsupported", "CTPTBaseline", "MTABaseline", "PromptEnsembleBaseline",
           "RTPTBaseline", "TPTBaseline", "ViewEnsembleBaseline", "ZeroShotBaseline", "encode_prompt_embeddings"]


class BaselineUnsupported(ValueError):
    """The method's configuration has no straightforward transcription here."""


# -- building blocks (the authors' helpers, written out) --------------------------------------

def tokenize(texts: Sequence[str]) -> torch.Tensor:
    """open_clip.tokenize (C, 77), the authors' tokenizer. open_clip is imported here, not at the top: it imports
    torchvision, which imports torch._dynamo (seconds), and importing this module should not pay it."""
    import open_clip
    return open_clip.tokenize(list(texts))


def encode_prompt_embeddings(clip: torch.nn.Module, prompts: torch.Tensor, tokenized: torch.Tensor) -> torch.Tensor:
    """TPT's `TextEncoder.forward`: prompt embeddings (C, 77, W) -> unnormalised features (C, D), all 77 positions."""
    x = prompts + clip.positional_embedding
    x = clip.transformer(x, attn_mask=clip.attn_mask)
    x = clip.ln_final(x)
    x = x[torch.arange(x.shape[0], device=x.device), tokenized.argmax(dim=-1)]
    proj = clip.text_projection
    return proj(x) if isinstance(proj, torch.nn.Linear) else x @ proj


def l2_normalize(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=-1, keepdim=True)


def n_confident(n_views: int, top: float) -> int:
    """How many views TPT's filter keeps: the authors' int(N * top), but at least one.

    The authors' int(N * top) is 0 below 10 views at top = 0.1, and their `avg_entropy` then takes
    log(0) ("math domain error"); the library keeps at least one view (`methods.common.confidence.n_selected`),
    so the baseline does too, or the two would not run the same method.
    """
    return max(1, int(n_views * top))


def select_confident_samples(logits: torch.Tensor, top: float) -> tuple[torch.Tensor, torch.Tensor]:
    """TPT's `select_confident_samples` (keeping `n_confident` views)."""
    batch_entropy = -(logits.softmax(1) * logits.log_softmax(1)).sum(1)
    idx = torch.argsort(batch_entropy, descending=False)[:n_confident(batch_entropy.size()[0], top)]
    return logits[idx], idx


def avg_entropy(outputs: torch.Tensor) -> torch.Tensor:
    """TPT's `avg_entropy`: entropy of the mean probability over the selected views (at least one)."""
    if outputs.shape[0] < 1:
        raise ValueError("avg_entropy: no views selected")
    logits = outputs - outputs.logsumexp(dim=-1, keepdim=True)
    avg_logits = logits.logsumexp(dim=0) - math.log(logits.shape[0])
    min_real = torch.finfo(avg_logits.dtype).min
    avg_logits = torch.clamp(avg_logits, min=min_real)
    return -(avg_logits * torch.exp(avg_logits)).sum(dim=-1)


def pointwise_entropy(outputs: torch.Tensor) -> torch.Tensor:
    """R-TPT's loss: the mean of the selected views' own entropies."""
    return -(outputs.softmax(1) * outputs.log_softmax(1)).sum(1).mean()


def feature_dispersion(text_features: torch.Tensor) -> torch.Tensor:
    """C-TPT's ATFD: mean L2 distance of the class features to their centroid."""
    prompt_mean = text_features.mean(0)
    return torch.linalg.norm(text_features - prompt_mean, dim=-1).mean()


def top_similarity(sim: torch.Tensor, k: int, self_mask: str) -> torch.Tensor:
    """R-TPT's `get_top_sim`: mean similarity of each view to its k nearest other views."""
    sim = sim.clone()
    if self_mask == "threshold":       # the authors' rule
        sim[sim >= 1.0] = float("-inf")
    else:                              # drop the diagonal by position
        idx = torch.arange(sim.shape[-1], device=sim.device)
        sim[..., idx, idx] = float("-inf")
    return sim.topk(min(k, sim.shape[-1] - 1), dim=-1).values.mean(-1)


class PromptLearner:
    """TPT's `PromptLearner` for one context string: [SOS] ctx_1..ctx_n name . [EOT] padded to 77 tokens."""

    def __init__(self, clip: torch.nn.Module, classnames: Sequence[str], ctx_init: str, device: torch.device):
        ctx_init = ctx_init.replace("_", " ")
        n_ctx = len(ctx_init.split(" "))
        names = [name.replace("_", " ") for name in classnames]
        prompts = [ctx_init + " " + name + "." for name in names]
        self.tokenized = tokenize(prompts).to(device)            # (C, 77)
        with torch.no_grad():
            embedding = clip.token_embedding(self.tokenized).float()       # (C, 77, W)
        self.token_prefix = embedding[:, :1, :]
        self.token_suffix = embedding[:, 1 + n_ctx:, :]
        self.ctx_init_state = embedding[0, 1:1 + n_ctx, :].clone()
        self.n_ctx = n_ctx

    def prompts(self, ctx: torch.Tensor) -> torch.Tensor:
        ctx = ctx.unsqueeze(0).expand(self.token_prefix.shape[0], -1, -1)
        return torch.cat([self.token_prefix, ctx, self.token_suffix], dim=1)


# -- the per-method procedures ----------------------------------------------------------------

class BaselineMethod:
    """One method, one image at a time; `split` accumulates seconds per part."""
    name = ""
    needs_views = True
    parts = ("image_encode", "text_tower", "method")

    def __init__(self, model: ClipModel, classnames: Sequence[str], config: MethodConfig | None = None,
                 precision: str = "auto"):
        self.model = model
        self.precision = precision
        self.clip = model.clip
        self.classnames = list(classnames)
        self.config = config
        self.device = model.device
        self.mean = torch.tensor(model.preprocess.mean, device=self.device).view(3, 1, 1)
        self.std = torch.tensor(model.preprocess.std, device=self.device).view(3, 1, 1)
        self.split = {p: 0.0 for p in self.parts}

    # timing ---------------------------------------------------------------------------------
    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    @contextlib.contextmanager
    def timed(self, part: str) -> Iterator[None]:
        t0 = self._now()
        try:
            yield
        finally:
            self.split[part] += self._now() - t0

    def reset_split(self) -> None:
        self.split = {p: 0.0 for p in self.parts}

    # shared steps -----------------------------------------------------------------------------
    def to_input(self, views_u8: torch.Tensor) -> torch.Tensor:
        """ToTensor + Normalize, as torchvision does it."""
        x = views_u8.to(self.device).float().div(255)
        return (x - self.mean) / self.std

    def encode_images(self, x: torch.Tensor) -> torch.Tensor:
        with self.timed("image_encode"), torch.no_grad(), self.autocast():
            return l2_normalize(self.clip.encode_image(x).float())

    def encode_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        with self.timed("text_tower"), torch.no_grad(), self.autocast():
            return l2_normalize(self.clip.encode_text(tokens).float())

    @property
    def logit_scale(self) -> torch.Tensor:
        return self.clip.logit_scale.exp()

    def policy(self, precision: str = "auto") -> Precision:
        """The run's precision (image tower, fixed prompts), or a method config's own where it sets one."""
        return resolve_precision(precision, self.device, run=self.precision)

    def autocast(self, precision: str = "auto") -> contextlib.AbstractContextManager:
        return self.policy(precision).autocast()

    def setup(self) -> None:
        """One-off work the authors' code does before the first image (timed by the caller, not per image)."""

    def predict(self, views_u8: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class ZeroShotBaseline(BaselineMethod):
    name = "zeroshot"
    needs_views = False

    def setup(self) -> None:
        names = [c.replace("_", " ") for c in self.classnames]
        self.tokens = tokenize([f"a photo of a {n}." for n in names]).to(self.device)

    def predict(self, views_u8: torch.Tensor) -> torch.Tensor:
        image_features = self.encode_images(self.to_input(views_u8[:1]))
        text_features = self.encode_tokens(self.tokens)          # every image, as the TPT code base's forward
        with self.timed("method"):
            return (self.logit_scale * image_features @ text_features.t())[0]


class PromptEnsembleBaseline(BaselineMethod):
    name = "prompt_ensemble"
    needs_views = False

    def setup(self) -> None:
        from ...datasets.classes import load_templates
        weights = []
        with torch.no_grad(), self.autocast():    # CLIP's `zeroshot_classifier`
            for name in self.classnames:
                texts = tokenize([t.format(name) for t in load_templates()]).to(self.device)
                embeddings = l2_normalize(self.clip.encode_text(texts).float())
                embedding = embeddings.mean(dim=0)
                weights.append(embedding / embedding.norm())
        self.weights = torch.stack(weights, dim=1)

    def predict(self, views_u8: torch.Tensor) -> torch.Tensor:
        image_features = self.encode_images(self.to_input(views_u8[:1]))
        with self.timed("method"):
            return (self.logit_scale * image_features @ self.weights)[0]


class ViewEnsembleBaseline(ZeroShotBaseline):
    name = "view_ensemble"
    needs_views = True

    def predict(self, views_u8: torch.Tensor) -> torch.Tensor:
        image_features = self.encode_images(self.to_input(views_u8))
        text_features = self.encode_tokens(self.tokens)
        with self.timed("method"):
            logits = self.logit_scale * image_features @ text_features.t()
            if getattr(self.config, "average", "probs") == "logits":
                return logits.mean(0)
            return logits.double().softmax(-1).mean(0).log().float()


class TPTBaseline(BaselineMethod):
    """TPT's `test_time_tuning` + prediction, with its model forward written out."""
    name = "tpt"

    def setup(self) -> None:
        cfg = self.config
        if cfg.ctx_checkpoint or not isinstance(cfg.ctx_init, str):
            raise BaselineUnsupported(f"{self.name}: the baseline covers a string ctx_init only")
        self.prompt_learner = PromptLearner(self.clip, self.classnames, cfg.ctx_init, self.device)

    def text_features(self, ctx: torch.Tensor) -> torch.Tensor:
        with self.timed("text_tower"), self.autocast(self.config.precision):
            learner = self.prompt_learner
            features = encode_prompt_embeddings(self.clip, learner.prompts(ctx), learner.tokenized)
        return l2_normalize(features.float())

    def model_forward(self, x: torch.Tensor, ctx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The authors' `model(inputs)`: encode the images (no grad), text features, logits."""
        image_features = self.encode_images(x)
        text_features = self.text_features(ctx)
        return self.logit_scale * image_features @ text_features.t(), image_features, text_features

    def loss(self, selected: torch.Tensor, text_features: torch.Tensor) -> torch.Tensor:
        return avg_entropy(selected)

    def readout(self, x: torch.Tensor, ctx: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            logits, _, _ = self.model_forward(x[:1], ctx)       # `model(image)`, image = view 0
        return logits[0]

    def predict(self, views_u8: torch.Tensor) -> torch.Tensor:
        cfg = self.config
        x = self.to_input(views_u8)
        with self.timed("method"):
            ctx = torch.nn.Parameter(self.prompt_learner.ctx_init_state.clone())   # model.reset()
            optimizer = torch.optim.AdamW([ctx], lr=cfg.lr, weight_decay=cfg.weight_decay)
            scaler = (torch.amp.GradScaler("cuda", init_scale=cfg.loss_scale)
                      if self.policy(cfg.precision).loss_scaling else None)
        selected_idx = None
        for _ in range(cfg.steps):
            output, _, text_features = self.model_forward(x, ctx)
            with self.timed("method"):
                output = output.float()
                if selected_idx is not None:
                    output = output[selected_idx]
                else:
                    output, selected_idx = select_confident_samples(output, cfg.selection_ratio)
                loss = self.loss(output, text_features)
                optimizer.zero_grad()
            self.optimizer_step(loss, optimizer, scaler)
        out = self.readout(x, ctx.detach())
        with self.timed("method"):
            return out.float()


    def optimizer_step(self, loss: torch.Tensor, optimizer: torch.optim.Optimizer,
                       scaler: torch.amp.GradScaler | None) -> None:
        """One (loss-scaled) optimiser step; the backward is timed as the text tower's, which it runs through."""
        with self.timed("text_tower"):
            (scaler.scale(loss) if scaler else loss).backward()
        with self.timed("method"):
            if scaler:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()


class CTPTBaseline(TPTBaseline):
    """C-TPT (`run_type='tpt_ctpt'`): TPT's loss - lambda * ATFD of the same forward's text features."""
    name = "ctpt"

    def loss(self, selected: torch.Tensor, text_features: torch.Tensor) -> torch.Tensor:
        return avg_entropy(selected) - self.config.lambda_atfd * feature_dispersion(text_features.float())


class RTPTBaseline(TPTBaseline):
    """R-TPT: pointwise entropy; prediction re-encodes all views and weights them by reliability."""
    name = "rtpt"

    def loss(self, selected: torch.Tensor, text_features: torch.Tensor) -> torch.Tensor:
        return pointwise_entropy(selected)

    def readout(self, x: torch.Tensor, ctx: torch.Tensor) -> torch.Tensor:
        cfg = self.config
        with torch.no_grad():
            output_all, image_features, _ = self.model_forward(x, ctx)
        with self.timed("method"):
            sim = image_features @ image_features.t()
            score = top_similarity(sim, cfg.k_neighbours, cfg.self_mask)
            weight = torch.softmax(score / cfg.temperature, dim=-1)
            return weight @ output_all.float()


class MTABaseline(BaselineMethod):
    """MTA's `solve_mta`, one image at a time, with text features computed once."""
    name = "mta"

    def setup(self) -> None:
        names = [c.replace("_", " ") for c in self.classnames]
        tokens = tokenize([f"a photo of a {n}." for n in names]).to(self.device)
        self.text_features = self.encode_tokens(tokens)

    @staticmethod
    def gaussian_kernel(mode: torch.Tensor, bandwidth: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        distances = torch.cdist(mode.unsqueeze(0), x, p=2).squeeze(0)
        return torch.exp(-distances ** 2 / (2 * bandwidth ** 2))

    def predict(self, views_u8: torch.Tensor) -> torch.Tensor:
        cfg = self.config
        image_features = self.encode_images(self.to_input(views_u8))
        with self.timed("method"), torch.no_grad():
            logits = self.logit_scale * image_features @ self.text_features.t()
            n = image_features.shape[0]
            # bandwidth: mean squared distance to the k nearest other views
            dist = torch.cdist(image_features, image_features)
            sorted_dist, _ = torch.sort(dist, dim=1)
            k = int(cfg.neighbour_ratio * (n - 1))
            mean_distance = torch.mean(sorted_dist[:, 1:k + 1] ** 2, dim=1)
            bandwidth = torch.sqrt(0.5 * mean_distance)
            # affinity of the views' zero-shot predictions
            probs = (logits / cfg.temperature).softmax(1)
            affinity = probs @ probs.t()
            y = torch.ones(n, device=image_features.device) / n
            mode = image_features[0]
            for _ in range(cfg.outer_iterations):
                for _ in range(cfg.inner_iterations):     # inlierness step
                    y_old = y.clone()
                    density = self.gaussian_kernel(mode, bandwidth, image_features)
                    y = ((density + cfg.lambda_q * (affinity * y.unsqueeze(0)).sum(1)) / cfg.lambda_y).softmax(0)
                    if torch.norm(y_old - y) < cfg.tol:
                        break
                for _ in range(cfg.inner_iterations):     # mode step
                    mode_old = mode.clone()
                    weighted = self.gaussian_kernel(mode, bandwidth, image_features) * y
                    mode = (weighted.unsqueeze(1) * image_features).sum(0) / weighted.sum()
                    mode = mode / mode.norm(p=2, dim=-1)
                    if torch.norm(mode_old - mode) < cfg.tol:
                        break
            return self.logit_scale * mode @ self.text_features.t()

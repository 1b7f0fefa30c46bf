"""`ClipModel`: a frozen open_clip CLIP in eval mode with normalisation inside, and the one image
encoder (`encode_views`) that the engine and `Method.predict` share."""
from __future__ import annotations

import contextlib
import hashlib

import torch
import torch.nn as nn
import torch.nn.functional as F
from PIL import Image

from ..views.generator import base_view, to_uint8_tensor
from ..views.preprocess import Preprocess
from .precision import Precision

ENCODE_CHUNK = 256      # views per image-tower call; one value for the engine and the library


class ClipModel(nn.Module):
    """A frozen open_clip CLIP in eval mode with normalisation inside.

    - `encode_pixels(x01)`: images in [0, 1] -> L2-normalised features.
    - `encode_normalized(x)`: normalised images -> L2-normalised features (with gradient).
    - `encode_views(x, precision)`: the image encoder of the engine and of `Method.predict`:
      chunked, no gradient, under the precision policy's autocast, float32 features.
    - `cast(dtype)`: this model with half-precision weights (the `fp16-pure` precision, shiftlab.models.precision).
    - `logit_scale`: the learned temperature (100 for OpenAI CLIP) as a float.
    - `checkpoint_sha256`: SHA-256 of the weights file read (None for random weights).
    - `weights_seed`, `weights_sha256`: for random weights, the seed they were built from and the digest
      of the weights (`state_dict_sha256`, taken on first use and kept: a run's identity asks for it);
      None for a checkpoint (its SHA-256 pins it).
    - `weights_source`: where that file verifiably came from ("openai-url", "hf-hub:ORG/REPO" or None;
      `shiftlab.models.checkpoints.weights_source`), what published numbers are shown by.
    - `base_pretrained`, `base_checkpoint_sha256`: for a checkpoint holding only an image tower (FARE, TeCoA),
      the CLIP its text tower came from and that file's SHA-256 (shiftlab.models.loader); None otherwise.
    """

    base_pretrained: str | None = None
    base_checkpoint_sha256: str | None = None

    def __init__(self, clip: nn.Module, name: str, pretrained: str | None, preprocess: Preprocess,
                 checkpoint_sha256: str | None = None, weights_source: str | None = None,
                 weights_seed: int | None = None, weights_sha256: str | None = None):
        super().__init__()
        self.clip = clip.eval()
        for p in self.clip.parameters():
            p.requires_grad_(False)
        self.name = name
        self.pretrained = pretrained
        self.preprocess = preprocess
        self.checkpoint_sha256 = checkpoint_sha256
        self.weights_source = weights_source
        self.weights_seed = weights_seed
        self._weights_sha256 = weights_sha256
        self.register_buffer("mean", torch.tensor(preprocess.mean).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(preprocess.std).view(1, 3, 1, 1), persistent=False)
        # Convolutional towers (ResNets) run in channels_last: ~1.2x faster on the CPU in fp32 (interleaved
        # A/B, benchmarks/image_tower_ab.py; same top-1, logits within 1e-5) and what lets fp16
        # convolutions use tensor cores on a GPU. Transformers gain nothing and keep their layout.
        self.channels_last = any(isinstance(m, nn.Conv2d) and m.kernel_size != m.stride
                                 for m in self.clip.visual.modules())
        if self.channels_last:
            self.clip.visual.to(memory_format=torch.channels_last)
        self.input_dtype = torch.float32   # what the image tower reads (float16 in a `cast` copy)

    def cast(self, dtype: torch.dtype) -> ClipModel:
        """A copy with its weights in `dtype` as the authors' half-precision CLIP holds them (open_clip's
        `convert_weights_to_lp`, the counterpart of OpenAI's `convert_weights` that their `clip.load`
        applies on CUDA: convolution, linear, attention and projection weights cast, normalisation
        layers' parameters kept float32). Made once and kept outside the module tree (its state_dict
        and `.to()` do not see it)."""
        import copy

        import open_clip
        copies = self.__dict__.setdefault("_cast_copies", {})
        if dtype not in copies:
            clip = copy.deepcopy(self.clip)
            open_clip.model.convert_weights_to_lp(clip, dtype)
            half = ClipModel(clip, self.name, self.pretrained, self.preprocess, self.checkpoint_sha256,
                             self.weights_source, self.weights_seed, self.weights_sha256)   # the float32 weights
            half.input_dtype = dtype
            half.base_pretrained, half.base_checkpoint_sha256 = self.base_pretrained, self.base_checkpoint_sha256
            copies[dtype] = half
        return copies[dtype]

    def __repr__(self) -> str:
        """One line (not torch's tree of every module): the architecture, its weights, size and device."""
        if self.pretrained is not None:
            weights = f"pretrained={self.pretrained!r}"
        else:
            weights = f"random weights (seed {self.weights_seed})" if self.weights_seed is not None else "weights given"
        n = sum(p.numel() for p in self.clip.parameters())
        return (f"ClipModel({self.name}, {weights}, image_size={self.image_size}, {n / 1e6:.1f}M parameters, "
                f"{self.device})")

    def train(self, mode: bool = True) -> ClipModel:
        # BatchNorm must keep its running statistics: the model is never put in train mode.
        return super().train(False)

    @property
    def weights_sha256(self) -> str | None:
        if self._weights_sha256 is None and self.weights_seed is not None:
            self._weights_sha256 = state_dict_sha256(self.clip)   # RN50, 102 M values: ~3 s on a busy CPU, once
        return self._weights_sha256

    @property
    def logit_scale(self) -> float:
        return float(self.clip.logit_scale.detach().exp())

    @property
    def device(self) -> torch.device:
        return self.clip.logit_scale.device

    @property
    def image_size(self) -> int:
        return self.preprocess.image_size

    def normalize(self, x01: torch.Tensor) -> torch.Tensor:
        return (x01 - self.mean.to(x01.dtype)) / self.std.to(x01.dtype)

    def encode_normalized(self, x: torch.Tensor) -> torch.Tensor:
        if self.channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        return F.normalize(self.clip.encode_image(x.to(self.input_dtype)), dim=-1)

    def encode_pixels(self, x01: torch.Tensor) -> torch.Tensor:
        return self.encode_normalized(self.normalize(x01))

    def encode_views(self, x: torch.Tensor, precision: Precision | None = None,
                     chunk_size: int = ENCODE_CHUNK) -> torch.Tensor:
        """Normalised views (N, 3, S, S) -> (N, D) float32 L2-normalised features, without gradient.

        `precision` is the image tower's policy (`shiftlab.models.precision`; None: float32); the engine
        and `Method.predict` both encode through here, so they agree. Inference mode (faster than
        no_grad in the interleaved A/B, benchmarks/image_tower_ab.py); the result is cloned out of it
        so that methods may use it in autograd graphs (prompt tuning's loss). A policy with a
        `model_dtype` ("fp16-pure" on CUDA) encodes with the `cast` copy, as the authors' half model."""
        if precision is not None and precision.model_dtype is not None:
            return self.cast(precision.model_dtype).encode_views(x, None, chunk_size)
        with torch.inference_mode(), (precision.autocast() if precision is not None else contextlib.nullcontext()):
            feats = torch.cat([self.encode_normalized(x[i:i + chunk_size])
                               for i in range(0, x.shape[0], chunk_size)]).float()
        return feats.clone()

    def transform(self, image: Image.Image) -> torch.Tensor:
        """A PIL image -> (3, S, S) float32 normalised input, like open_clip's eval preprocess: the
        run's view 0 (this model's resize, centre crop and interpolation) in 8 bits, then normalised."""
        x = to_uint8_tensor(base_view(image.convert("RGB"), self.image_size, self.preprocess))
        return self.normalize(x.float().div(255).unsqueeze(0))[0]

    def forward(self, x01: torch.Tensor) -> torch.Tensor:
        return self.encode_pixels(x01)


def state_dict_sha256(module: nn.Module) -> str:
    """SHA-256 over `module.state_dict()`: each tensor's key, dtype, shape and bytes in the standard
    (contiguous) layout, keys in sorted order, so the memory format and the device do not change it."""
    digest = hashlib.sha256()
    for key, tensor in sorted(module.state_dict().items()):
        data = tensor.detach().cpu().contiguous()
        digest.update(f"{key}\t{data.dtype}\t{tuple(data.shape)}\n".encode())
        digest.update(data.reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()

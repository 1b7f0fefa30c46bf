"""The precision policy: how a method's (or the image tower's) computation runs.

One owner for what "fp32", "fp16", "bf16" and "auto" mean, so the engine, the methods and
the bench baselines cannot drift apart:

- "fp32": float32 throughout; on CUDA also without TF32 (inside `autocast()` only), so GPU
  numbers are comparable with CPU ones;
- "fp16" / "bf16": autocast to that dtype on CUDA (fp16 with loss scaling where a method
  takes gradient steps, as the authors' GradScaler does);
- "fp16-pure": the model itself in float16, no autocast: what TDA's authors run (their
  `clip.load` on CUDA casts the convolution, linear, attention and projection weights to fp16
  and keeps the normalisation layers' parameters in float32; `model_dtype`, and
  `ClipModel.cast` makes that copy). A method setting only (`--set tda.precision=fp16-pure`);
  methods that support it say so (`Method.supports_pure_fp16`);
- "auto": the run's setting; a run's "auto" is fp16 autocast on CUDA.

On the CPU everything runs in float32 whatever is asked (the authors ran on GPUs; CPU
autocast or CPU half kernels would only change numbers, not reproduce theirs, and CPU half
convolutions are 4-5x slower than float32 ones).

A method's config may name its own precision (the paper protocol does, per method); the
run's precision is handed to methods as a run setting and applies where the method says
"auto" (`resolve(method_setting, device, run=run_setting)`).
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..options import say_set

if TYPE_CHECKING:
    import torch
# torch is imported where it is used: the precision names are read without it (a method's spec)

RUN_PRECISIONS = ("auto", "fp32", "fp16", "bf16")     # a run's --precision
PURE_FP16 = "fp16-pure"
PRECISIONS = (*RUN_PRECISIONS, PURE_FP16)             # a method's `precision` field


def check(name: str) -> str:
    """`name` if it is a known (method) precision, else a one-line ValueError."""
    if name not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {name!r}")
    return name


def check_run(name: str) -> str:
    """`name` if it is a known run precision, else a one-line ValueError ("fp16-pure" is per method)."""
    if name == PURE_FP16:
        raise ValueError(f"precision {PURE_FP16!r} is a method setting (the authors' half-precision model, e.g. "
                         f"{say_set('tda', 'precision', PURE_FP16)}), not a run's; "
                         f"a run's is one of {', '.join(RUN_PRECISIONS)}")
    if name not in RUN_PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(RUN_PRECISIONS)}, got {name!r}")
    return name


@dataclass(frozen=True)
class Precision:
    """A resolved policy: `name` is what was asked ("fp32", "fp16", "bf16", "fp16-pure"; "auto" only
    as a run's own default), `device_type` where it runs."""
    name: str
    device_type: str

    @property
    def amp_dtype(self) -> torch.dtype | None:
        """Autocast dtype, or None for float32 (always None off CUDA)."""
        if self.device_type != "cuda" or self.name in ("fp32", PURE_FP16):
            return None
        import torch
        return torch.bfloat16 if self.name == "bf16" else torch.float16

    @property
    def model_dtype(self) -> torch.dtype | None:
        """The dtype the model's weights are cast to ("fp16-pure" on CUDA: float16, with the
        normalisation layers' parameters kept in float32, as the authors' `clip.load`), or None: the
        model as loaded (float32)."""
        if self.device_type != "cuda" or self.name != PURE_FP16:
            return None
        import torch
        return torch.float16

    @property
    def loss_scaling(self) -> bool:
        """Whether gradient steps scale the loss (fp16 only, as torch's GradScaler)."""
        import torch
        return self.amp_dtype == torch.float16

    @property
    def key(self) -> str:
        """What the computation actually does here: "fp32", "fp16", "bf16" or "fp16-pure" (for sharing
        results: image features are shared between methods with equal keys)."""
        return precision_key(self.name, self.device_type)

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        """Run the enclosed computation under this policy."""
        dtype = self.amp_dtype
        if dtype is not None:
            import torch
            with torch.autocast(device_type=self.device_type, dtype=dtype):
                yield
        elif self.device_type == "cuda":
            with _no_tf32():
                yield
        else:
            yield


@contextlib.contextmanager
def _no_tf32() -> Iterator[None]:
    import torch
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


def precision_key(name: str, device_type: str, run: str = "auto") -> str:
    """`Precision.key` without torch: what a computation asking for `name` ("auto": the run's `run`) does on a
    device of `device_type` ("cpu", "cuda", "mps"): "fp32" off CUDA and for fp32; on CUDA "fp16-pure" (the model
    cast), "bf16", or "fp16" (fp16 and "auto" autocast)."""
    chosen = run if name == "auto" else name
    if device_type != "cuda" or chosen == "fp32":
        return "fp32"
    if chosen == PURE_FP16:
        return PURE_FP16
    return "bf16" if chosen == "bf16" else "fp16"


def resolve(name: str, device: torch.device | str, run: str = "auto") -> Precision:
    """The policy for a computation asking for `name` in a run whose setting is `run`:
    `name` wins unless it is "auto"; a run's "auto" is fp16 autocast on CUDA, fp32 elsewhere."""
    check(name)
    check_run(run)
    chosen = run if name == "auto" else name
    import torch
    return Precision(chosen, torch.device(device).type)

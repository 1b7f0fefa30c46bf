"""The precision policy (shiftlab.models.precision): what each setting means, per device, and who wins."""
from __future__ import annotations

import pytest
import torch

from shiftlab.models.precision import Precision, resolve


@pytest.mark.parametrize("name, want", [("auto", torch.float16), ("fp16", torch.float16),
                                        ("bf16", torch.bfloat16), ("fp32", None)])
def test_cuda_autocast_dtypes(name, want):
    policy = resolve(name, "cuda")
    assert policy.amp_dtype == want
    assert policy.loss_scaling == (want == torch.float16)
    assert policy.key == {torch.float16: "fp16", torch.bfloat16: "bf16", None: "fp32"}[want]


@pytest.mark.parametrize("name", ["auto", "fp32", "fp16", "bf16"])
def test_cpu_is_always_float32(name):
    policy = resolve(name, torch.device("cpu"))
    assert policy.amp_dtype is None and not policy.loss_scaling and policy.key == "fp32"
    x = torch.ones(2, 2)
    with policy.autocast():
        assert (x @ x).dtype == torch.float32


def test_method_setting_wins_over_the_run_unless_auto():
    assert resolve("auto", "cuda", run="fp32").name == "fp32"
    assert resolve("bf16", "cuda", run="fp32").name == "bf16"
    assert resolve("fp32", "cuda", run="fp16").amp_dtype is None
    assert resolve("auto", "cuda", run="auto").amp_dtype == torch.float16


@pytest.mark.parametrize("bad", ["fp8", "FP32", "", "half"])
def test_unknown_precision_is_one_clear_error(bad):
    with pytest.raises(ValueError, match=r"precision must be one of auto, fp32, fp16, bf16, fp16-pure, got "):
        resolve(bad, "cpu")
    with pytest.raises(ValueError, match="precision must be one of"):
        resolve("auto", "cpu", run=bad)


def test_fp32_on_cuda_turns_tf32_off_only_inside():
    """fp32 means float32 matmuls and convolutions, not TF32; the process-wide flags come back after."""
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        with Precision("fp32", "cuda").autocast():
            assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def test_methods_receive_the_run_precision_as_a_setting(tiny_model):
    import shiftlab
    tpt = shiftlab.create_method("tpt", tiny_model, ["cat", "dog"], run_precision="bf16")
    assert tpt.config.precision == "auto" and tpt.precision.name == "bf16"
    own = shiftlab.create_method("mta", tiny_model, ["cat", "dog"], run_precision="bf16", precision="fp32")
    assert own.precision.name == "fp32"
    with pytest.raises(ValueError, match=r"precision: 'fp64' is not a choice; must be one of"):
        shiftlab.create_method("zero", tiny_model, ["cat", "dog"], precision="fp64")

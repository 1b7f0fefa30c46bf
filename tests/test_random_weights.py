"""Random weights are a function of a seed, and the run identity pins them.

Unseeded weights would make two runs of the same command disagree, and a `--resume` silently
continue with another model than the one that wrote the records; each test here fails if the
weights do not follow the seed or the identity does not record it."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import shiftlab
from _runs import comparable
from shiftlab.cli import main as cli_main
from shiftlab.datasets import build_dataset
from shiftlab.engine import config, distributed
from shiftlab.engine import loop as engine
from shiftlab.engine.distributed import DistContext
from shiftlab.models import state_dict_sha256
from shiftlab.rundir import identity, record_files
from shiftlab.rundir.identity import RunIdentityError
from shiftlab.synthetic import make_imagenet_r, tiny_clip

REPO = Path(__file__).resolve().parents[1]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return make_imagenet_r(tmp_path_factory.mktemp("data"), classes=range(0, 200, 25), per_class=1)   # 8 images


def _argv(data: Path, out: Path, *extra: str) -> list[str]:
    # batches of one: a sample added by a resume is encoded alone, as in the uninterrupted run
    return ["run", "--data", str(data), "--model", "shiftlab-tiny", "--pretrained", "none", "--methods",
            "zeroshot,tpt,tda", "--set", "tpt.steps=1", "--set", "tda.text_head=zeroshot", "--views", "4",
            "--workers", "0", "--batch-size", "1", "--device", "cpu", "--no-progress", "--allow-partial",
            "--online-checkpoint-seconds", "0", "--out", str(out), *extra]


def _strip(path: Path) -> list[str]:
    return comparable(record_files.iter_records(path))


def _errors(capsys) -> list[str]:
    return [ln for ln in capsys.readouterr().err.splitlines() if "error" in ln]


def _independent_digest(module: torch.nn.Module) -> str:
    """The straightforward computation state_dict_sha256 must agree with."""
    digest = hashlib.sha256()
    for key in sorted(module.state_dict()):
        t = module.state_dict()[key].detach().cpu().contiguous()
        digest.update(f"{key}\t{t.dtype}\t{tuple(t.shape)}\n".encode() + t.numpy().tobytes())
    return digest.hexdigest()


# -- the library -------------------------------------------------------------------------------

def test_random_weights_depend_on_the_seed_alone_and_leave_the_global_rng_alone():
    torch.manual_seed(1234)
    state = torch.get_rng_state()
    a = shiftlab.load_model("shiftlab-tiny", None, seed=0)
    assert torch.equal(torch.get_rng_state(), state)               # the caller's stream is untouched
    torch.rand(1000)                                                # whatever ran before does not matter
    b = shiftlab.load_model("shiftlab-tiny", None, seed=0)
    c = shiftlab.load_model("shiftlab-tiny", None, seed=1)
    sa, sb, sc = (m.clip.state_dict() for m in (a, b, c))
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)
    assert (a.weights_seed, c.weights_seed) == (0, 1)
    assert a.weights_sha256 == b.weights_sha256 != c.weights_sha256
    # the digest is of the weights, not of their layout (the ResNet tower runs channels_last)
    assert a.channels_last and a.weights_sha256 == state_dict_sha256(a.clip) == _independent_digest(a.clip)
    tiny = tiny_clip(0)
    assert tiny.weights_sha256 == a.weights_sha256 and tiny.cast(torch.float16).weights_sha256 == a.weights_sha256
    for bad in (True, 1.5, "0", 2 ** 64):
        with pytest.raises(ValueError, match="seed must be an integer"):
            shiftlab.load_model("shiftlab-tiny", None, seed=bad)


def test_a_checkpoint_has_no_seed_and_no_weights_digest(tiny_checkpoint):
    model = shiftlab.load_model("shiftlab-tiny", str(tiny_checkpoint))
    assert model.weights_seed is None and model.weights_sha256 is None and model.checkpoint_sha256
    assert state_dict_sha256(model.clip) == tiny_clip(0).weights_sha256   # the file holds tiny_clip(0)


def test_another_process_builds_the_same_bytes():
    code = ("import torch, shiftlab; torch.manual_seed(99); torch.randn(7);"
            "print(shiftlab.load_model('shiftlab-tiny', None, seed=3).weights_sha256)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-1] == shiftlab.load_model("shiftlab-tiny", None, seed=3).weights_sha256


# -- the run identity --------------------------------------------------------------------------

def test_run_json_records_the_model_seed_and_digest_and_resume_refuses_another_model(data, tmp_path, capsys):
    out = tmp_path / "run"
    assert cli_main(_argv(data, out, "--limit", "2", "--seed", "3")) == 0
    shared = json.loads((out / "run.json").read_text())["shared"]
    assert shared["model_seed"] == 3 and shared["checkpoint_sha256"] is None     # --model-seed defaults to --seed
    assert shared["weights_sha256"] == shiftlab.load_model("shiftlab-tiny", None, seed=3).weights_sha256
    before = (out / "records.jsonl").read_bytes()
    capsys.readouterr()
    assert cli_main(_argv(data, out, "--limit", "2", "--seed", "3", "--model-seed", "4", "--resume")) == 2
    err = _errors(capsys)
    assert len(err) == 1 and "cannot resume" in err[0] and "model_seed 3 -> 4" in err[0]
    assert "weights_sha256 " in err[0]
    assert (out / "records.jsonl").read_bytes() == before
    # the library: a model of another seed passed in is refused the same way
    ds = build_dataset("imagenet-r", data)
    cfg = config.RunConfig(data=str(data), model="shiftlab-tiny", pretrained=None, methods=["zeroshot"], views=4,
                           seed=3, limit=2, out=str(out), resume=True, workers=0, progress=False, device="cpu")
    with pytest.raises(RunIdentityError, match="weights_sha256"):
        engine.run(cfg, model=tiny_clip(5), dataset=ds)


def test_model_seed_needs_random_weights(data, tmp_path, tiny_checkpoint, capsys):
    argv = _argv(data, tmp_path / "run", "--model-seed", "1")
    argv[argv.index("none")] = str(tiny_checkpoint)
    assert cli_main(argv) == 2
    err = _errors(capsys)
    assert len(err) == 1 and "--model-seed seeds random weights only" in err[0]
    assert not (tmp_path / "run").exists()


def test_resume_after_raising_the_limit_equals_one_uninterrupted_run(data, tmp_path):
    """Episodic and online (tda) methods alike: the resumed run rebuilds the same weights."""
    ref, out = tmp_path / "ref", tmp_path / "run"
    assert cli_main(_argv(data, ref, "--limit", "6")) == 0
    assert cli_main(_argv(data, out, "--limit", "3")) == 0
    torch.rand(100)
    assert cli_main(_argv(data, out, "--limit", "6", "--resume")) == 0
    assert _strip(out / "records.jsonl") == _strip(ref / "records.jsonl")
    assert len(_strip(ref / "records.jsonl")) == 18


def test_old_run_json_without_the_fields():
    shared = {"model": "m", "checkpoint_sha256": "abc", "seed": 0}
    old = {"shared": dict(shared), "methods": {}, "shiftlab": "0.1"}
    new = {"shared": {**shared, "model_seed": None, "weights_sha256": None}, "methods": {}, "shiftlab": "0.2"}
    assert identity.check_resume("RUN", old, new).identity["shared"]["weights_sha256"] is None   # a checkpoint
    old["shared"]["checkpoint_sha256"] = new["shared"]["checkpoint_sha256"] = None
    new["shared"] |= {"model_seed": 0, "weights_sha256": "f00"}
    with pytest.raises(RunIdentityError, match="random weights were unseeded"):
        identity.check_resume("RUN", old, new)


def test_every_torchrun_rank_must_build_the_same_identity(data, tmp_path, monkeypatch):
    ident = {"shared": {"model": "m", "weights_sha256": "aa"}, "methods": {"zeroshot": {}}, "shiftlab": "1"}
    identity.check_ranks([ident, json.loads(json.dumps(ident))])
    other = json.loads(json.dumps(ident))
    other["shared"]["weights_sha256"] = "bb"
    with pytest.raises(RunIdentityError, match=r"rank 2 .*weights_sha256 \"aa\" -> \"bb\""):
        identity.check_ranks([ident, ident, other])
    # in a run: rank 1 (simulated) loaded other weights; rank 0 stops before writing anything
    monkeypatch.setattr(distributed, "context", lambda: DistContext(0, 2))

    def gather(ctx, obj):
        if isinstance(obj, dict) and "shared" in obj:
            return [obj, {**obj, "shared": {**obj["shared"], "weights_sha256": "another model"}}]
        return [obj, obj]
    monkeypatch.setattr(distributed, "all_gather", gather)
    cfg = config.RunConfig(data=str(data), model="shiftlab-tiny", pretrained=None, methods=["zeroshot"], views=1,
                           out=str(tmp_path / "run"), workers=0, progress=False, device="cpu")
    with pytest.raises(RunIdentityError, match="rank 1 of this torchrun job"):
        engine.run(cfg, model=tiny_clip(0), dataset=build_dataset("imagenet-r", data))
    assert not record_files.record_files(tmp_path / "run") and not (tmp_path / "run" / "run.json").exists()


@pytest.mark.slow
def test_two_processes_with_pretrained_none_give_the_same_records(data, tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1", SHIFTLAB_NUM_THREADS="1")
    outs = [tmp_path / "a", tmp_path / "b"]
    for out in outs:
        proc = subprocess.run([sys.executable, "-m", "shiftlab", *_argv(data, out, "--limit", "4")], env=env,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
    assert _strip(outs[0] / "records.jsonl") == _strip(outs[1] / "records.jsonl")
    assert len(_strip(outs[0] / "records.jsonl")) == 12
    other = tmp_path / "seed1"
    assert cli_main(_argv(data, other, "--limit", "4", "--model-seed", "1")) == 0   # and this process: another seed
    assert _strip(other / "records.jsonl") != _strip(outs[0] / "records.jsonl")


@pytest.mark.slow
def test_torchrun_two_ranks_with_random_weights_equal_one_process(data, tmp_path):
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]),
               SHIFTLAB_NUM_THREADS="1")
    env.pop("OMP_NUM_THREADS", None)
    one, two = tmp_path / "one", tmp_path / "two"
    assert cli_main(_argv(data, one)) == 0
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(port),
           "-m", "shiftlab", *_argv(data, two)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _strip(two / "records.jsonl") == _strip(one / "records.jsonl")
    assert json.loads((two / "run.json").read_text())["shared"] == json.loads((one / "run.json").read_text())["shared"]

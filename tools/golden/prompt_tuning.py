"""What the golden drivers of TPT-style prompt tuning share (A-TPT, O-TPT, N-TPT; BCA and HisTPT use the pieces):
OpenAI's BPE file their `clip/` reads, and the record of their `test_time_adapt_eval` per sample, taken by wrapping
their functions from outside.

`SampleSteps(variant, out).wrap(their, scaler)` records, per sample i: `V/i/selected` (their
`select_confident_samples` indices), `V/i/entropy_loss` (their `avg_entropy`, first step), `V/i/loss` (what their
GradScaler was handed, first step), `V/i/sK/ctx_grad` / `V/i/sK/ctx` (the context's gradient before and its value
after each optimiser step K) and `V/i/logits` (their final view-0 logits, from their `accuracy`, which ends a sample).
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

VOCAB_PATCH = ("clip/bpe_simple_vocab_16e6.txt.gz (not tracked by their repository) -> open_clip's copy of "
               "OpenAI's BPE vocabulary file")


def openai_bpe_vocab(clip_dir: Path) -> bool:
    """Copy open_clip's copy of OpenAI's BPE vocabulary into their `clip/` (their simple_tokenizer.py reads it; their
    repository does not track it). True when it was missing."""
    vocab = clip_dir / "bpe_simple_vocab_16e6.txt.gz"
    if vocab.is_file():
        return False
    import shutil

    import open_clip
    shutil.copyfile(Path(open_clip.__file__).parent / vocab.name, vocab)
    return True


def their_coop(their, model_path: str, lr: float, *more) -> tuple:
    """The model, optimiser, its initial state and GradScaler TPT's `main_worker` builds (A-TPT's, O-TPT's and
    DiffTPT's keep it): `their.get_coop(arch, 'R', gpu, 4, 'a_photo_of_a', *more)` with the tiny model file as the
    arch and 'cpu', everything but the prompt learner frozen, `AdamW(prompt_learner.parameters(), lr)`,
    `GradScaler(init_scale=1000)` (which torch disables without CUDA: no loss scale, as in float32)."""
    import copy

    import torch
    model = their.get_coop(model_path, "R", "cpu", 4, "a_photo_of_a", *more)
    for name, p in model.named_parameters():
        if "prompt_learner" not in name:
            p.requires_grad_(False)
    optimizer = torch.optim.AdamW(model.prompt_learner.parameters(), lr)
    return model, optimizer, copy.deepcopy(optimizer.state_dict()), torch.cuda.amp.GradScaler(init_scale=1000)


class SampleSteps:
    """The per-sample record of one variant's run into `out` (see the module's docstring); `i` the sample, `s` the
    optimiser step within it."""

    def __init__(self, variant: str, out: dict):
        self.variant, self.out, self.i, self.s, self.hooks = variant, out, 0, 0, []

    def key(self, name: str) -> str:
        return f"{self.variant}/{self.i}/{name}"

    def wrap(self, their, scaler, first_entropy: Callable[[], None] | None = None) -> None:
        """Wrap `their` module's select_confident_samples, avg_entropy (then `first_entropy()` on a first step) and
        accuracy, `scaler.scale`, and hook every optimiser step until `close()`."""
        orig_select, orig_avg = their.select_confident_samples, their.avg_entropy

        def select_confident_samples(logits, top):
            res = orig_select(logits, top)
            self.out[self.key("selected")] = res[1].detach().clone()
            return res

        def avg_entropy(outputs):
            res = orig_avg(outputs)
            if self.s == 0:
                self.out[self.key("entropy_loss")] = res.detach().clone()
                if first_entropy is not None:
                    first_entropy()
            return res

        their.select_confident_samples, their.avg_entropy = select_confident_samples, avg_entropy
        self.end_on(their)
        self.first(scaler, "scale", "loss", lambda res, loss: loss)
        self.hook_steps()

    def first(self, owner, name: str, key: str, pick: Callable) -> None:
        """Wrap `owner.name`: at a sample's first step (or in a method without steps) record `pick(result, *args)`
        under `key`."""
        from harness import after_call

        def record(res, *args, **kwargs):
            if self.s == 0:
                self.out[self.key(key)] = pick(res, *args, **kwargs).detach().clone()
        after_call(owner, name, record)

    def hook_steps(self) -> None:
        """Until `close()`: `sK/ctx_grad` before and `sK/ctx` after each optimiser step K (the first parameter of its
        first group: the context)."""
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        def pre_step(opt, args, kwargs):
            self.out[self.key(f"s{self.s}/ctx_grad")] = opt.param_groups[0]["params"][0].grad.detach().clone()

        def post_step(opt, args, kwargs):
            self.out[self.key(f"s{self.s}/ctx")] = opt.param_groups[0]["params"][0].detach().clone()
            self.s += 1
        self.hooks = [register_optimizer_step_pre_hook(pre_step), register_optimizer_step_post_hook(post_step)]

    def end_on(self, their, key: str = "logits") -> None:
        """`their.accuracy` (their meters only) -> records the output's first row under `key` and ends the sample."""
        import torch

        def accuracy(output, target, topk=(1,)):
            self.out[self.key(key)] = output[0].detach().float().clone()
            self.i += 1
            self.s = 0
            return [torch.zeros(1) for _ in topk]
        their.accuracy = accuracy

    def close(self, n_samples: int) -> None:
        """Remove the optimiser hooks; every sample must have ended (their `accuracy` called once each)."""
        for hook in self.hooks:
            hook.remove()
        assert self.i == n_samples, (self.i, self.s)

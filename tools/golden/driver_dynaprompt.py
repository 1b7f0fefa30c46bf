"""The driver that runs DynaPrompt's code (github.com/zzzx1224/DynaPrompt, `dynap_classification.py`) on the tiny CLIP.

As drivers.py: their modules are imported from the checkout and patched only from outside (CPU, float32,
the tiny model file, an in-memory stream, a log file in memory), and values are recorded by wrapping their
functions. What runs is their `test_time_adapt_eval` with the model, optimiser, optimiser state and
GradScaler that their `main_worker` builds (`get_coop(..., num_p)`, AdamW over the prompt learner,
`GradScaler(init_scale=1000)`, which torch disables on a machine without CUDA: no loss scale, as in
float32), after `reset_classnames` with the golden class names.

Per sample, per tuning step, the fixture holds the two `topk` calls of their `test_time_tuning` (the
prompts' mean view entropy and their probability-difference statistic, with the orders topk returned),
the confident views (`select_confident_samples`), the per-prompt loss terms (their `avg_entropy` on the
selected views) and the gradient of the prompt buffer at `optimizer.step`; after the sample, the buffer
(`prompt_learner.ctx`, the residuals on the initial context), `ctx_order`, `ctx_use`, the prompts the
readout used and the final logits.
"""
from __future__ import annotations

import argparse
import copy
import io
from pathlib import Path

import torch
from drivers import all_tokens, clip_normalize, cpu_float32, enter, jit_load_reads_state_dicts, unit_views
from torch.optim.optimizer import register_optimizer_step_pre_hook

N_VIEWS = 64     # scripts/test_dynap.sh: bs=64 (63 augmented views + the original)
# variant -> (num_prompts, tta_steps); the authors' run_dynap.sh: num_p=12, the default --tta_steps 1
VARIANTS = {"authors": (12, 1), "small": (3, 1)}


def run_dynaprompt(checkout: Path, model_path: str, inputs: dict, classnames: list[str], variant: str) -> dict:
    patches = cpu_float32() + [jit_load_reads_state_dicts()]
    enter(checkout)
    import clip.custom_clip_lessctx as lessctx
    import dynap_classification as dynap
    num_prompts, tta_steps = VARIANTS[variant]
    # their main_worker: get_coop(args.arch, args.test_sets, args.gpu, ...) -- the device is the patch here
    model = dynap.get_coop(model_path, "R", "cpu", 4, "a_photo_of_a", False, num_prompts)
    for name, p in model.named_parameters():
        if "prompt_learner" not in name:
            p.requires_grad_(False)
    lr = 0.005
    optimizer = torch.optim.AdamW(model.prompt_learner.parameters(), lr)
    optim_state = copy.deepcopy(optimizer.state_dict())
    scaler = torch.cuda.amp.GradScaler(init_scale=1000)
    # the prompts that matter are those of reset_classnames (get_coop first builds ImageNet's 1000)
    seen: list[torch.Tensor] = []
    orig_tokenize = lessctx.tokenize

    def tokenize(*a, **k):
        out = orig_tokenize(*a, **k)
        seen.append(out.clone())
        return out
    lessctx.tokenize = tokenize
    model.reset_classnames(classnames, model_path)
    out: dict[str, torch.Tensor] = {"init_ctx": model.prompt_learner.init_ctx.detach().clone()}
    step = {"i": 0, "s": 0, "topk": 0, "entropy": 0, "tuning": False}
    learner = model.prompt_learner

    def key(name: str) -> str:
        return f"{step['i']}/s{step['s']}/{name}"

    orig_topk = torch.Tensor.topk

    def topk(self, *a, **k):
        res = orig_topk(self, *a, **k)
        which = ("ent", "plpd")[step["topk"] % 2]
        step["topk"] += 1
        out[key(which)] = self.detach().clone()
        out[key(f"{which}_order")] = res[1].detach().clone()
        return res

    orig_select, orig_avg = dynap.select_confident_samples, dynap.avg_entropy

    def select_confident_samples(logits, top):
        res = orig_select(logits, top)
        out[key("views")] = res[1].detach().clone()
        return res

    def avg_entropy(outputs):
        res = orig_avg(outputs)
        if not step["tuning"]:               # the readout's log-only entropy
            return res
        step["entropy"] += 1
        if step["entropy"] % 2 == 0:         # the second call of a step: the loss on the selected views
            out[key("loss_terms")] = res.detach().reshape(-1).clone()
        return res

    def pre_step(opt, args, kwargs):
        out[key("grad")] = opt.param_groups[0]["params"][0].grad.detach().clone()
        step["s"] += 1
    hook = register_optimizer_step_pre_hook(pre_step)

    orig_tuning = dynap.test_time_tuning

    def test_time_tuning(model_, inputs_, optimizer_, scaler_, args_, log_file_):
        i = step["i"]
        step["s"] = 0
        out[f"{i}/ctx_before"] = learner.ctx.detach().clone()      # after their reset of the oldest prompt
        out[f"{i}/order_before"] = torch.tensor(learner.ctx_order, dtype=torch.int64)
        out[f"{i}/use_before"] = torch.tensor(learner.ctx_use, dtype=torch.int64)
        torch.Tensor.topk, step["tuning"] = topk, True
        try:
            res = orig_tuning(model_, inputs_, optimizer_, scaler_, args_, log_file_)
        finally:
            torch.Tensor.topk, step["tuning"] = orig_topk, False
        out[f"{i}/selected"] = torch.as_tensor(res[0], dtype=torch.int64).reshape(-1).clone()
        out[f"{i}/ctx"] = learner.ctx.detach().clone()
        out[f"{i}/order"] = torch.tensor(learner.ctx_order, dtype=torch.int64)
        out[f"{i}/use"] = torch.tensor(learner.ctx_use, dtype=torch.int64)
        return res

    def accuracy(output, target, topk=(1,)):
        out[f"{step['i']}/logits"] = output[0].detach().float().clone()
        step["i"] += 1
        return [torch.zeros(1) for _ in topk]

    dynap.select_confident_samples, dynap.avg_entropy = select_confident_samples, avg_entropy
    dynap.test_time_tuning, dynap.accuracy = test_time_tuning, accuracy
    loader = [([clip_normalize(v).unsqueeze(0) for v in unit_views(base, N_VIEWS)], torch.tensor([int(y)]))
              for base, y in zip(inputs["base_u8"], inputs["labels"])]
    log_file = io.StringIO()
    args = argparse.Namespace(cocoop=False, tpt=True, onlinetpt=True, num_prompts=num_prompts, tta_steps=tta_steps,
                              selection_p=0.1, batch_size=N_VIEWS, lr=lr, gpu=0, print_freq=10**9,
                              log_date="250129", n_ctx=4, ctx_init="a_photo_of_a")
    dynap.test_time_adapt_eval(loader, model, None, optimizer, optim_state, scaler, log_file, args)
    hook.remove()
    meta = {"num_prompts": num_prompts, "tta_steps": tta_steps, "lr": lr, "selection_p": 0.1, "n_ctx": 4,
            "ctx_init": "a_photo_of_a", "n_views": N_VIEWS, "log_date": args.log_date,
            "grad_scaler_enabled": scaler.is_enabled(),
            "patches": patches + [
                "get_coop(..., device='cpu') (their main_worker passes args.gpu)",
                "dynap_classification.accuracy -> records the output (their top-1/top-5 meters are not used)",
                "log_file: an in-memory text buffer (their log lines are kept in `log`)"],
            "called": "dynap_classification.test_time_adapt_eval(loader, model, None, optimizer, optim_state, scaler, "
                      "log_file, args) with model = get_coop(tiny, 'R', 'cpu', 4, 'a_photo_of_a', False, num_prompts) "
                      "and reset_classnames(golden classnames, tiny); optimizer = AdamW(prompt_learner.parameters(), "
                      "0.005), optim_state its initial state_dict, "
                      "scaler = torch.cuda.amp.GradScaler(init_scale=1000); "
                      "args as scripts/test_dynap.sh (--tpt --onlinetpt, bs 64, log_date without 'noapp')",
            "recorded_by_wrapping": [
                "dynap_classification.test_time_tuning (buffer, ctx_order, ctx_use before and after; its returned "
                "prompt indices)",
                "torch.Tensor.topk while test_time_tuning runs (its two calls per step: p_ent and plpd, input and "
                "returned order)",
                "dynap_classification.select_confident_samples (the confident views)",
                "dynap_classification.avg_entropy (its second call per step: the per-prompt loss terms)",
                "torch.optim optimizer-step pre-hook (the buffer's gradient)",
                "dynap_classification.accuracy (final logits)"],
            "log": log_file.getvalue().splitlines()}
    return {"tensors": out, "meta": meta, "tokens": all_tokens(seen)}

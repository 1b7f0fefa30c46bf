"""One source for the two spellings of every option a message may name: the library's keyword
(`allow_partial=True`) and the command line's flag (`--allow-partial`).

A message that tells the user what to pass is built with `say("allow_partial")`; it reads the
spelling of whoever called shiftlab: the CLI (`cli.main`) runs inside `speaking_cli()`, everything
else (a script, a notebook, the tests) gets the Python spelling. The table below is the only place
where a flag and its keyword are paired, so the two can never drift apart.
"""
from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Option:
    """One option: its keyword (`RunConfig`'s field or a function's keyword argument, with the value
    that asks for it) and its command-line flag (with its value, if it takes one)."""
    keyword: str
    flag: str


# the option's name in messages -> its two spellings
OPTIONS: dict[str, Option] = {
    "allow_partial": Option("allow_partial=True", "--allow-partial"),
    "download": Option("allow_download=True (RunConfig: download=True)", "--download"),
    "trust_checkpoint": Option("trust_checkpoint=True", "--trust-checkpoint"),
    "pretrained_file": Option("pretrained='/path/to/checkpoint'", "--pretrained /path/to/checkpoint"),
    "pretrained": Option("pretrained=", "--pretrained"),
    "base_pretrained": Option("base_pretrained=TAG|FILE", "--base-pretrained TAG|FILE"),
    "classnames": Option("classnames=[...]", "--classnames FILE"),
    "resume": Option("resume=True", "--resume"),
    "out": Option("another out=", "another --out"),
    "save_probs": Option("save_probs=True", "--save-probs"),
    "data": Option("data=", "--data"),
    "dataset": Option("dataset=", "--dataset"),
    "model": Option("model=", "--model"),
    "views": Option("views=N", "--views"),
    "methods": Option("methods=", "--methods"),
    "limit": Option("limit=", "--limit"),
    "features": Option("features=DIR", "--features DIR"),
    "clean_and_robust": Option("clean_and_robust=True", "--clean-and-robust"),
    "attack": Option("attack={'name': ...}", "--attack"),
    "attack_subset": Option("attack_subset=N", "--attack-subset N"),
    "attack_target": Option("attack_target=", "--attack-target"),
    "eot": Option("eot=K", "--eot K"),
    "seed": Option("seed=", "--seed"),
    "order": Option("order=", "--order"),
    "orders": Option("orders=", "--orders"),
    "delta": Option("delta=", "--delta"),
    "corruption": Option("corruption=", "--corruption"),
    "corruptions": Option("corruptions=", "--corruptions"),
    "severity": Option("severity=", "--severity"),
    "ood": Option("ood=[...]", "--ood"),
    "ood_ratio": Option("ood_ratio=", "--ood-ratio"),
    "suite": Option("suite=", "--suite"),
    "datasets": Option("datasets=[...]", "--datasets"),
    "compare": Option("compare=", "--compare"),
    "reference": Option("reference=", "--reference"),
    "random_weights": Option("pretrained=None", "--pretrained none"),
    "batch_size": Option("batch_size=", "--batch-size"),
    "precision": Option("precision=", "--precision"),
}

_CLI: contextvars.ContextVar[bool] = contextvars.ContextVar("shiftlab_cli", default=False)


def say(name: str, value: object = None) -> str:
    """How the caller spells option `name`: its flag under the CLI, its keyword in Python. With a `value`
    (a placeholder such as 'D', or the value itself): `--delta D` under the CLI, `delta=D` in Python."""
    option = OPTIONS[name]
    if value is None:
        return option.flag if _CLI.get() else option.keyword
    if _CLI.get():
        return f"{option.flag.split()[0]} {value}"
    return f"{option.keyword.split('=')[0]}={value}"


def name_of(name: str) -> str:
    """The option's bare name, as a message's subject: `--orders` under the CLI, `orders` in Python."""
    option = OPTIONS[name]
    return option.flag.split()[0] if _CLI.get() else option.keyword.split("=")[0]


def say_set(method: str, field: str, value: object) -> str:
    """How the caller sets one field of a method's config: `--set tpt.lr=0.01`, or in Python
    `tpt's lr=0.01 (RunConfig: method_config={'tpt': {'lr': 0.01}})`."""
    if _CLI.get():
        return f"--set {method}.{field}={value}"
    return f"{method}'s {field}={value!r} (RunConfig: method_config={{{method!r}: {{{field!r}: {value!r}}}}})"


def cli_speaking() -> bool:
    """Whether messages are being built for the command line."""
    return _CLI.get()


@contextlib.contextmanager
def speaking_cli() -> Iterator[None]:
    """Within: messages name flags (what `cli.main` runs its command in)."""
    token = _CLI.set(True)
    try:
        yield
    finally:
        _CLI.reset(token)

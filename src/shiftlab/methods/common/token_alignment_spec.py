"""The torch-free half of what the token-aligning methods share (PromptAlign, TAPT; the torch half:
token_alignment.py): the spec they subclass, which names the statistics files their config reads and refuses a
config that aligns without them before torch is imported, so a run plan refuses it in one line and `--methods all`
leaves the method out with a word (`MethodSpec.config_problem`): none of these files can be downloaded."""
from __future__ import annotations

import os
from typing import Any, ClassVar

from ...options import say_set
from ..catalogue.declarations import MethodSpec


class TokenAlignmentSpec(MethodSpec):
    # {target: (means field, vars field)} of its config: the statistics files the method's `load_targets` reads
    statistics_files: ClassVar[dict[str, tuple[str, str]]] = {}
    statistics_file_names: ClassVar[str] = ""   # the files' names, for the refusal when a field is unset

    @classmethod
    def config_problem(cls, config: Any, attacked: bool = False) -> str | None:
        if not config.align:
            return None
        fields = [f for pair in cls.statistics_files.values() for f in pair]
        missing = [f for f in fields if getattr(config, f) is None]
        if missing:
            listed = " and ".join(missing) if len(missing) <= 2 else ", ".join(missing)
            return (f"{cls.name} aligns token statistics: set {listed} (their {cls.statistics_file_names} files; "
                    f"e.g. {say_set(cls.name, missing[0], 'FILE')}), or {say_set(cls.name, 'align', False)}")
        absent = [f for f in fields if not os.path.isfile(os.path.expanduser(getattr(config, f)))]
        return f"{cls.name}.{absent[0]}: no such file {getattr(config, absent[0])}" if absent else None

"""One state per setting for an online method in a run of several settings (clean, each attacked budget, transfer
and adaptive).

An online method's state carries along the stream (docs/ONLINE.md). A run of several settings steps every setting
over each batch, so one state would adapt along all of the settings' streams interleaved. Instead each setting has
its own state: before the method computes a setting's batch, that setting's state is loaded into it
(`load_state_dict`, as a resume does), and after, what the batch left is saved back (`state_dict`, deep-copied so
that nothing the method goes on to change in place reaches it). Each setting's records are therefore those of a run
with that one setting alone. The states are checkpointed together (`state_dict`: {"settings": {setting: state}}),
so `rundir.online_state.OnlineState` saves and restores a `SettingStates` as it does a method.

A run of one setting has no `SettingStates`: the method keeps its one state, as before.
"""
from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator, Mapping, Sequence
from typing import Any


class SettingStates:
    """Method `method`'s state per setting of `settings`, each starting from the state the method holds now."""

    def __init__(self, method: Any, settings: Sequence[str]):
        self.method = method
        self.name = method.name
        self.spec = method.spec
        initial = copy.deepcopy(method.state_dict())
        self.states = {s: copy.deepcopy(initial) for s in settings}

    @contextlib.contextmanager
    def use(self, setting: str) -> Iterator[None]:
        """The method holding `setting`'s state for the block; what the block leaves is kept as that state (a block
        that raises leaves the state as it was: a step that fails part-way is redone from it)."""
        self.method.load_state_dict(self.states[setting])
        yield
        self.states[setting] = copy.deepcopy(self.method.state_dict())

    def state_dict(self) -> dict[str, Any]:
        """Every setting's state (what `OnlineState` checkpoints)."""
        return {"settings": dict(self.states)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned; a checkpoint of other settings is refused."""
        saved = state.get("settings")
        if not isinstance(saved, dict) or set(saved) != set(self.states):
            got = sorted(saved) if isinstance(saved, dict) else "one state for all settings"
            raise ValueError(f"{self.name}: the checkpoint holds states for {got}, this run has settings "
                             f"{sorted(self.states)}")
        for one in saved.values():
            self.method.load_state_dict(one)   # checks its version and class count
        self.states = copy.deepcopy(dict(saved))


def setting_states(methods: Mapping[str, Any], online: Sequence[str],
                   settings: Sequence[str]) -> dict[str, SettingStates]:
    """{online method: its SettingStates} for a run of several settings; {} for a run of one (nothing changes)."""
    if len(settings) < 2:
        return {}
    return {n: SettingStates(methods[n], settings) for n in online}

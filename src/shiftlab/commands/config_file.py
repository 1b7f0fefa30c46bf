"""`--config FILE`: any flag of `shiftlab run` (and of `sweep` and `encode`, which share them) from a TOML file
(YAML too where PyYAML is installed), flags on the command line winning.

    # run.toml
    dataset = "imagenet-r"
    data = "~/data"
    model = "RN50"
    methods = ["zeroshot", "tpt", "mta"]     # or "zeroshot,tpt,mta"
    limit = 500
    batch-size = 8                           # a flag's name; batch_size works too
    resume = true                            # an on/off flag: true gives it, false leaves it out
    [set]                                    # --set METHOD.FIELD=VALUE, repeatable
    tpt = { lr = 0.01, steps = 2 }

The file is turned into the flags it stands for (`flags`), put right after the subcommand and before the
flags typed on the command line, and parsed by the one parser: every value meets the same checks as
the flag typed by hand, and a flag typed on the command line wins (a repeatable flag such as `--set`
adds to the file's, later values winning). The run records the file (path, SHA-256, its values) in
run.json and summary.json (`RunConfig.config_file`). A key that is no flag of the command is refused
in one line, with the closest flag when one is near.
"""
from __future__ import annotations

import argparse
import difflib
import hashlib
from pathlib import Path
from typing import Any

OPTION = "--config"
NOT_IN_A_FILE = ("help", "config")


class ConfigFileError(ValueError):
    """A config file that cannot be read or holds something no flag takes; one line."""


def add_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(OPTION, default=None, metavar="FILE",
                   help="read flags from a TOML file (`.yaml`/`.yml`: YAML, with PyYAML): each key a flag's name "
                        "(limit = 500, methods = [\"tpt\", \"mta\"], [set] tpt = {lr = 0.01}); flags given on "
                        "the command line win; run.json records the file (docs/CONFIG.md)")


def load(path: str | Path) -> dict[str, Any]:
    """The file's table: TOML (tomllib), or YAML for .yaml/.yml (PyYAML)."""
    path = Path(path).expanduser()
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigFileError(f"{OPTION} {path}: cannot read it ({exc.strerror or exc})") from None
    if path.suffix.lower() in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise ConfigFileError(f"{OPTION} {path}: YAML needs PyYAML (pip install pyyaml), or write it as "
                                  "TOML") from None
        try:
            table = yaml.safe_load(data.decode("utf-8"))
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            raise ConfigFileError(f"{OPTION} {path}: not valid YAML ({' '.join(str(exc).split())})") from None
        table = {} if table is None else table
    else:
        import tomllib
        try:
            table = tomllib.loads(data.decode("utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigFileError(f"{OPTION} {path}: not valid TOML ({exc})") from None
    if not isinstance(table, dict):
        raise ConfigFileError(f"{OPTION} {path}: expected a table of flag = value, got {type(table).__name__}")
    return table


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """A subcommand's optional flags by every name a file may give them: 'batch-size', 'batch_size', and
    the dest ('method_config' for --set)."""
    out: dict[str, argparse.Action] = {}
    for action in parser._actions:
        longs = [o for o in action.option_strings if o.startswith("--")]
        if not longs:
            continue
        for name in [o[2:] for o in longs] + [action.dest]:
            if name not in NOT_IN_A_FILE:
                out.setdefault(name, action)
                out.setdefault(name.replace("-", "_"), action)
    return out


def _scalar(value: Any, where: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return str(value)
    raise ConfigFileError(f"{where}: expected a string, number or true/false, got {type(value).__name__}")


def _set_items(value: Any, where: str) -> list[str]:
    """--set values from a list of 'M.F=V' strings, or a table {method: {field: value}} / {'M.F': value}."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [_scalar(v, where) for v in value]
    if isinstance(value, dict):
        items = []
        for key, inner in value.items():
            if isinstance(inner, dict):
                items += [f"{key}.{field}={_scalar(v, f'{where}.{key}.{field}')}" for field, v in inner.items()]
            else:
                items.append(f"{key}={_scalar(inner, f'{where}.{key}')}")
        return items
    raise ConfigFileError(f"{where}: expected METHOD.FIELD=VALUE strings or a table, got {type(value).__name__}")


def flags(parser: argparse.ArgumentParser, table: dict[str, Any], source: str) -> list[str]:
    """The command-line flags `table` stands for, checked against `parser`'s own flags."""
    options = _options(parser)
    out: list[str] = []
    named: dict[int, str] = {}   # id(action) -> the key that gave it: one flag, one key
    for key, value in table.items():
        action = options.get(str(key))
        where = f"{source}: {key}"
        if action is None:
            near = difflib.get_close_matches(str(key), sorted(options), n=1)
            hint = f" (did you mean {near[0]}?)" if near else ""
            raise ConfigFileError(f"{where}: no such flag of `shiftlab {parser.prog.split()[-1]}`{hint}")
        if id(action) in named:   # batch_size and batch-size: which one wins would be a silent choice
            raise ConfigFileError(f"{source}: {named[id(action)]} and {key} are the same flag; keep one of them")
        named[id(action)] = str(key)
        flag = next(o for o in action.option_strings if o.startswith("--"))   # --x of --x/--no-x
        if isinstance(action, argparse.BooleanOptionalAction):
            if not isinstance(value, bool):
                raise ConfigFileError(f"{where}: expected true or false, got {value!r}")
            out.append(flag if value else "--no-" + flag[2:])
        elif action.nargs == 0:   # store_true: the flag, or nothing
            if not isinstance(value, bool):
                raise ConfigFileError(f"{where}: expected true or false, got {value!r}")
            out += [flag] if value else []
        elif isinstance(action, argparse._AppendAction):
            items = _set_items(value, where) if action.dest == "method_config" else (
                [_scalar(v, where) for v in value] if isinstance(value, list) else [_scalar(value, where)])
            for item in items:
                out += [flag, item]
        else:
            text = ",".join(_scalar(v, where) for v in value) if isinstance(value, list) else _scalar(value, where)
            out.append(f"{flag}={text}")   # '=': a value starting with '-' is not read as a flag
    return out


def _subcommand(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[int, argparse.ArgumentParser] | None:
    """(index in argv, parser) of the subcommand, when argv names one."""
    subs = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    for i, token in enumerate(argv):
        if not token.startswith("-"):
            return (i, subs.choices[token]) if subs is not None and token in subs.choices else None
    return None


def _config_path(argv: list[str]) -> str | None:
    for i, token in enumerate(argv):
        if token == "--":
            return None
        if token == OPTION and i + 1 < len(argv):
            return argv[i + 1]
        if token.startswith(OPTION + "="):
            return token[len(OPTION) + 1:]
    return None


def expand(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[list[str], dict[str, Any] | None]:
    """argv with the config file's flags after the subcommand (before the typed flags, which win), and the
    record of the file (path, sha256, values) to keep with the run; (argv, None) without --config."""
    found = _subcommand(parser, argv)
    if found is None:
        return argv, None
    at, sub = found
    path = _config_path(argv[at + 1:])
    if path is None or not any(OPTION in a.option_strings for a in sub._actions):
        return argv, None
    table = load(path)
    resolved = Path(path).expanduser().resolve()
    record = {"path": str(resolved), "sha256": hashlib.sha256(resolved.read_bytes()).hexdigest(), "values": table}
    return argv[:at + 1] + flags(sub, table, str(path)) + argv[at + 1:], record

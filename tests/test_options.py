"""The library speaks Python, the command line its flags (#34 item 4).

A message the library raises names the caller's spelling through `shiftlab.options` (`say`, `name_of`,
`say_set`): `resume=True` from a script, `--resume` under `shiftlab run`. The scan below reads every string
literal of src/shiftlab outside the command line's own modules, so a new message that names only a flag fails
here with the file and line to fix.
"""
from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

import pytest

from shiftlab import options, writes
from shiftlab.options import OPTIONS, name_of, say, say_set, speaking_cli

SRC = Path(__file__).resolve().parents[1] / "src" / "shiftlab"
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
SHELL_COMMAND = re.compile(r"shiftlab [a-z]+\b")   # `shiftlab download X --root DIR`: a command to type, not an option

# the command line's own modules: flags are their language
CLI_MODULES = ("cli.py", "commands/", "options.py", "__main__.py")
# files whose text is written to disk (pages, tables, the README's methods table): the same bytes whoever
# wrote them (a report built from a script and from `shiftlab report` are one file), so they name the flags
# that docs/CLI.md maps to keywords, rather than the spelling of whichever caller happened to write them
WRITTEN_TEXT = {
    "report/": "report.html's caveats and section texts",
    "results/suite_table.py": "suite.md's partial-column marks",
    "results/summary.py": "summary.md's notes",
    "results/corruption_table.py": "the corruption table's notes",
    "bench/": "the bench's printed report (only `shiftlab bench` runs it)",
    "methods/catalogue/listing.py": "the README's generated methods table and its command",
}


def _strings(tree: ast.AST) -> list[tuple[int, str]]:
    """Every string literal but docstrings, an f-string read whole (its fields as {}): one walk of the tree."""
    out: list[tuple[int, str]] = []

    def visit(node: ast.AST) -> None:
        body = getattr(node, "body", None)
        for child in ast.iter_child_nodes(node):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body \
                    and isinstance(child, ast.Expr) and child is body[0] and isinstance(child.value, ast.Constant):
                continue   # a docstring
            if isinstance(child, ast.JoinedStr):
                out.append((child.lineno, "".join(p.value if isinstance(p, ast.Constant) else "{}"
                                                  for p in child.values)))
                continue   # its parts are read with it
            if isinstance(child, ast.Constant) and isinstance(child.value, str):
                out.append((child.lineno, child.value))
            visit(child)
    visit(tree)
    return out


def flag_only_messages(root: Path = SRC) -> list[str]:
    """'file:line: text' of every library string that names a command-line flag itself."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(CLI_MODULES) or rel.startswith(tuple(WRITTEN_TEXT)):
            continue
        for line, text in _strings(ast.parse(path.read_text(), str(path))):
            for match in FLAG.finditer(text):
                if not SHELL_COMMAND.search(text[:match.start()]):
                    found.append(f"{rel}:{line}: {text[:100]!r}")
                    break
    return sorted(found, key=lambda f: (f.split(":")[0], int(f.split(":")[1])))


def test_no_library_message_names_only_a_flag():
    found = flag_only_messages()
    assert not found, ("messages naming a command-line flag outside the CLI: build them with shiftlab.options "
                       "(say / name_of / say_set) so that Python callers read their keyword:\n" + "\n".join(found))


def test_the_scan_finds_a_flag_only_message(tmp_path):
    """The scan is not vacuous: a flag in a raised message, plain or f-string, is found; a docstring, a
    command to type and a message built with `say` are not."""
    (tmp_path / "mod.py").write_text(
        '"""Docstrings may talk about --resume."""\n'
        'def f(x):\n'
        '    """Nor here: --out."""\n'
        '    if x:\n'
        '        raise ValueError("pass --resume to continue")\n'
        '    raise ValueError(f"{x}: choose another --out")\n'
        'def g(root):\n'
        '    return f"get them with: shiftlab download imagenet-r --root {root}"\n'
        'def h():\n'
        '    return f"pass {say(\'resume\')}"\n')
    assert flag_only_messages(tmp_path) == ["mod.py:5: 'pass --resume to continue'",
                                            "mod.py:6: '{}: choose another --out'"]


def _cli_flags() -> set[str]:
    from shiftlab.cli import build_parser
    flags: set[str] = set()
    parsers = [build_parser()]
    while parsers:
        parser = parsers.pop()
        for action in parser._actions:
            flags.update(action.option_strings)
            if isinstance(action, argparse._SubParsersAction):
                parsers.extend(action.choices.values())
    return flags


def test_every_option_names_a_real_flag_and_a_keyword():
    flags = _cli_flags()
    for name, option in OPTIONS.items():
        flag = FLAG.search(option.flag)
        assert flag and flag.group() in flags, (name, option.flag)
        assert "--" not in option.keyword and option.keyword.split("=")[0].split()[-1].isidentifier(), option


def test_each_spelling_follows_the_caller():
    assert (say("resume"), name_of("orders"), say("delta", "D"), say("datasets", "a,b")) == \
        ("resume=True", "orders", "delta=D", "datasets=a,b")
    assert say_set("tps", "text_head", "ensemble") == \
        "tps's text_head='ensemble' (RunConfig: method_config={'tps': {'text_head': 'ensemble'}})"
    assert writes.resume_advice() == "then rerun with resume=True: the records written so far are kept"
    assert not options.cli_speaking()
    with speaking_cli():
        assert options.cli_speaking()
        assert (say("resume"), name_of("orders"), say("delta", "D"), say("datasets", "a,b")) == \
            ("--resume", "--orders", "--delta D", "--datasets a,b")
        assert say_set("tps", "text_head", "ensemble") == "--set tps.text_head=ensemble"
        assert writes.resume_advice() == writes.RESUME_ADVICE == \
            "then rerun with --resume: the records written so far are kept"
    assert not options.cli_speaking()


@pytest.mark.parametrize(("call", "python", "cli"), [
    (lambda: __import__("shiftlab.datasets.suites", fromlist=["x"]).resolve_suite("x", "a,b"),
     "give either suite or datasets, not both", "give either --suite or --datasets, not both"),
    (lambda: __import__("shiftlab.datasets.suites", fromlist=["x"]).resolve_suite(None, ","),
     "datasets needs at least one dataset name, e.g. datasets=imagenet-r,imagenet-a",
     "--datasets needs at least one dataset name, e.g. --datasets imagenet-r,imagenet-a"),
    (lambda: __import__("shiftlab.datasets.corruptions", fromlist=["x"]).parse_corruptions("fog,fog"),
     "corruptions lists a corruption twice: fog,fog", "--corruptions lists a corruption twice: fog,fog"),
    (lambda: __import__("shiftlab.rundir.stream", fromlist=["x"]).stream_order(4, "continual", 0, domains=[0] * 4),
     "give two or more (datasets=a,b or suite)", "give two or more (--datasets a,b or --suite)"),
])
def test_library_refusals_name_keywords_and_the_cli_its_flags(call, python, cli):
    with pytest.raises(ValueError) as info:
        call()
    assert python in str(info.value) and "--" not in str(info.value)
    with speaking_cli(), pytest.raises(ValueError) as info:
        call()
    assert cli in str(info.value)


def test_a_method_file_setting_is_named_as_the_caller_sets_it(tiny_model):
    """TPS's descriptors file (and so every method file setting built with say_set): the method's field in Python,
    `--set` under the CLI (#34: the message named only `--set tps.descriptors_file=PATH`)."""
    import shiftlab
    model = tiny_model
    with pytest.raises(ValueError) as info:
        shiftlab.create_method("tps", model, ["cat", "dog"], text_head="descriptors")
    assert str(info.value).endswith(
        "pass tps's descriptors_file='PATH' (RunConfig: method_config={'tps': {'descriptors_file': 'PATH'}}) "
        "(or tps's text_head='ensemble' (RunConfig: method_config={'tps': {'text_head': 'ensemble'}}))")
    with speaking_cli(), pytest.raises(ValueError) as info:
        shiftlab.create_method("tps", model, ["cat", "dog"], text_head="descriptors")
    assert str(info.value).endswith("pass --set tps.descriptors_file=PATH (or --set tps.text_head=ensemble)")

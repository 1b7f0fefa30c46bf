"""No test leaves a method of its own in the registry: every test module registers one through
tests/_registered.py's `registered` (which removes it and checks), never with a bare register call."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from _registered import registered
from shiftlab.methods.base import Method, MethodOutput, list_methods

TESTS = Path(__file__).parent
BARE = re.compile(r"\b(register_method|register_spec)\(")
CHILD_ONLY = "# registers in a child process"   # a subprocess's setup (tests/_gate.py SHIFTLAB_TEST_SETUP)


def test_every_test_module_registers_methods_through_the_scoped_helper():
    modules = [p for p in sorted(TESTS.rglob("*.py")) if p.name != "_registered.py" and "fixtures" not in p.parts]
    offenders = [f"{path.relative_to(TESTS)}:{number}: {line.strip()}" for path in modules
                 for number, line in enumerate(path.read_text().splitlines(), 1)
                 if BARE.search(line) and not line.lstrip().startswith(("#", "from ", "import "))
                 and CHILD_ONLY not in line and "BARE" not in line]
    assert offenders == []


class _Echo(Method):
    summary = "test: zero-shot logits"
    needs_views = False

    def predict_context(self, ctx):
        return MethodOutput(ctx.zeroshot_logits)


def test_the_helper_removes_the_method_even_when_the_test_fails():
    with pytest.raises(RuntimeError), registered("test_echo_once", _Echo):
        assert "test_echo_once" in list_methods()
        raise RuntimeError
    assert "test_echo_once" not in list_methods()

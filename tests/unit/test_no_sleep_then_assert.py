"""No unit test waits for time to pass and then asserts (issue 24, "time is injected").

A fixed sleep before a check guesses how long the code under test needs: too short on a
loaded machine (a flaky test), too long everywhere else. A unit test moves a
:class:`peer.testing.ManualClock`, waits for an event, or waits for a condition through
:func:`peer.timing.wait_until` / :func:`peer.timing.wait_until_sync`.

The rule checked here, on the syntax tree of every module in tests/unit: a call of
``time.sleep(x)`` or ``asyncio.sleep(x)`` (or ``sleep`` imported from either) with ``x`` anything
but the literal 0 may not be followed, in its block or in any block around it up to its
function (so a hand-written poll loop followed by an assertion counts), by a statement that
holds an ``assert``. ``await asyncio.sleep(0)``, a yield to the loop, is fine; so is
``clock.sleep(x)`` on a manual clock. The exceptions are listed in ``ALLOWED``, each with why.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

UNIT = Path(__file__).resolve().parent

# (module, function) -> why a real sleep before an assertion is honest there
ALLOWED: dict[tuple[str, str], str] = {
    (
        "test_spool.py",
        "test_kill_9_during_appends_leaves_only_whole_batches",
    ): "the random sleep is the fault injected: SIGKILL at a random moment of a child's "
    "appends; what is asserted holds whenever the kill lands",
}

SLEEP_MODULES = {"time", "asyncio"}


def _sleep_names(tree: ast.Module) -> set[str]:
    """Names bound to time.sleep / asyncio.sleep by ``from ... import sleep [as x]``."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in SLEEP_MODULES:
            names.update(a.asname or a.name for a in node.names if a.name == "sleep")
    return names


def _is_real_sleep(call: ast.Call, bare: set[str]) -> bool:
    func = call.func
    named = (
        isinstance(func, ast.Attribute)
        and func.attr == "sleep"
        and isinstance(func.value, ast.Name)
        and func.value.id in SLEEP_MODULES
    ) or (isinstance(func, ast.Name) and func.id in bare)
    if not named:
        return False
    seconds = call.args[0] if call.args else None
    return not (isinstance(seconds, ast.Constant) and seconds.value == 0)


def _has_assert(statements: list[ast.stmt]) -> bool:
    return any(isinstance(n, ast.Assert) for s in statements for n in ast.walk(s))


def _blocks(node: ast.AST) -> Iterator[list[ast.stmt]]:
    for field in ("body", "orelse", "finalbody"):
        block = getattr(node, field, None)
        if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
            yield block
    for handler in getattr(node, "handlers", ()):
        yield handler.body
    for case in getattr(node, "cases", ()):
        yield case.body


def violations(source: str) -> list[tuple[int, str]]:
    """(line, function) of each real sleep followed by an assertion, as the rule says."""
    tree = ast.parse(source)
    bare = _sleep_names(tree)
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST, function: str, later: list[list[ast.stmt]]) -> None:
        # ``later``: for each enclosing block, the statements after the one holding ``node``
        for block in _blocks(node):
            for i, statement in enumerate(block):
                scope = (
                    statement.name
                    if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef)
                    else function
                )
                # a nested function is a block of its own: what follows its definition is not
                # run after its sleeps
                after = [] if scope != function else [*later, block[i + 1 :]]
                calls = [
                    n
                    for n in _shallow(statement)
                    if isinstance(n, ast.Call) and _is_real_sleep(n, bare)
                ]
                if calls and any(_has_assert(rest) for rest in after):
                    found.extend((c.lineno, scope) for c in calls)
                visit(statement, scope, after)

    visit(tree, "<module>", [])
    return found


def _shallow(statement: ast.stmt) -> Iterator[ast.AST]:
    """The nodes of ``statement`` outside the blocks it holds (those are visited as blocks)."""
    stack: list[ast.AST] = [statement]
    inner = {id(s) for block in _blocks(statement) for s in block}
    while stack:
        node = stack.pop()
        yield node
        stack.extend(c for c in ast.iter_child_nodes(node) if id(c) not in inner)


def test_no_unit_test_sleeps_and_then_asserts() -> None:
    offenders = []
    used = set()
    for path in sorted(UNIT.glob("*.py")):
        for line, function in violations(path.read_text()):
            if (path.name, function) in ALLOWED:
                used.add((path.name, function))
                continue
            offenders.append(f"{path.name}:{line} in {function}")
    assert not offenders, (
        "a fixed sleep followed by an assertion (use ManualClock, an event or wait_until): "
        + ", ".join(offenders)
    )
    assert used == set(ALLOWED), f"exceptions no longer needed: {set(ALLOWED) - used}"


def test_the_rule_catches_a_sleep_before_an_assert_and_a_poll_loop() -> None:
    flagged = """
import asyncio, time
from time import sleep as nap

async def a():
    await asyncio.sleep(0.3)
    assert x

def b():
    while not done():
        time.sleep(0.01)
    assert y

def c():
    with ctx():
        nap(1)
    if z:
        assert z
"""
    assert [line for line, _ in violations(flagged)] == [6, 11, 16]


def test_the_rule_lets_yields_clock_sleeps_and_sleeps_after_the_checks_pass() -> None:
    fine = """
import asyncio, time

async def a(clock):
    await asyncio.sleep(0)
    await clock.sleep(5)
    assert x

def b():
    assert y
    time.sleep(0.1)

def c():
    def later():
        time.sleep(0.3)
    assert later
"""
    assert violations(fine) == []

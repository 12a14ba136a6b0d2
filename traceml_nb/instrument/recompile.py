"""A function recompiled with statements of ours inside it, instead of a wrapper around it.

:meth:`.tracer.StepTracer.wrap_next` times a DataLoader fetch from inside torch's own
``_BaseDataLoaderIter.__next__``: a wrapper around it costs a Python call of its own on every
fetch, about 1 µs once a model's step has evicted the interpreter's code from the caches.

:func:`recompiled` makes the copy. It is the function's own code wherever it is not ours: the
function's whole module is compiled from its source (so names, ``__future__`` imports and
private-name mangling mean what they meant), and the source is accepted only if the function
compiles to the very code that is loaded (bytecode, constants, names, line and column table).
The copy keeps the file name and line numbers, so a traceback through it reads as without us,
and it runs in the function's own globals. Where this cannot be established (no source, a
source edited since the import, a decorated function, a closure, a generator, a nested
function, a ``return`` inside a loop, parameters that are not ``self`` followed by defaulted
ones) it returns None. :func:`calling` then makes the
same statements around a call of the function, from a source of ours.
"""

from __future__ import annotations

import ast
import inspect
import linecache
import textwrap
from collections.abc import Callable, Mapping
from types import CodeType, FunctionType
from typing import Any

#: Every name our statements use starts with this (a copy's parameters and locals).
PREFIX = "_traceml_"
#: In ``on_return``: the value the function is returning.
VALUE = PREFIX + "value"

_UNSUPPORTED = (
    inspect.CO_GENERATOR
    | inspect.CO_COROUTINE
    | inspect.CO_ASYNC_GENERATOR
    | inspect.CO_VARARGS
    | inspect.CO_VARKEYWORDS
)
_NESTED_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)

#: id(code) -> (code, statements and names, the copy's code or None); by identity, as equal
#: code objects can come from different files
_cache: dict[int, tuple[CodeType, tuple[Any, ...], CodeType | None]] = {}


class Statements:
    """What goes into the copy, as source text; ``{self}`` is the function's first parameter.

    ``entry`` runs first; ``on_return`` runs once the body has returned (``VALUE`` holds what it
    returned; falling off the end returns None), as if after the call, and must end in a
    ``return``; ``on_stop`` runs when the body raises ``StopIteration``, which is then re-raised
    unchanged.
    """

    def __init__(self, entry: str, on_return: str, on_stop: str) -> None:
        self.entry = textwrap.dedent(entry)
        self.on_return = textwrap.dedent(on_return)
        self.on_stop = textwrap.dedent(on_stop)

    def key(self) -> tuple[str, str, str]:
        return self.entry, self.on_return, self.on_stop


def recompiled(
    fn: Callable[..., Any], names: Mapping[str, Any], statements: Statements
) -> FunctionType | None:
    """``fn``'s own code with ``statements`` inside it, or None where that cannot be made
    exactly (see the module's docstring). ``names`` (each starting with :data:`PREFIX`)
    become parameters after ``fn``'s own, with these values as defaults."""
    if type(fn) is not FunctionType or not _supported(fn.__code__, fn.__defaults__):
        return None
    code = fn.__code__
    key = (statements.key(), tuple(names))
    cached = _cache.get(id(code))
    if cached is not None and cached[0] is code and cached[1] == key:
        new_code = cached[2]
    else:
        new_code = _recompiled_code(code, fn.__globals__, tuple(names), statements)
        _cache[id(code)] = (code, key, new_code)
    if new_code is None:
        return None
    return _function(new_code, fn, tuple(fn.__defaults__ or ()) + tuple(names.values()))


def calling(
    fn: Callable[..., Any], names: Mapping[str, Any], statements: Statements
) -> FunctionType:
    """A function of one argument that calls ``fn`` with it, with ``statements`` inside it as
    :func:`recompiled` puts them: for where ``fn`` itself cannot be recompiled."""
    callee = PREFIX + "callee"
    source = f"def __next__(self, {callee}=None):\n    return {callee}(self)\n"
    filename = f"<traceml_nb: calls {getattr(fn, '__qualname__', 'a function')}>"
    tree = ast.parse(source, filename)
    definition = tree.body[0]
    assert isinstance(definition, ast.FunctionDef)
    _instrument(definition, tuple(names), statements)
    ast.fix_missing_locations(tree)
    module_code = compile(tree, filename, "exec", dont_inherit=True)
    new_code = _find_code(module_code, "__next__", 1)
    assert new_code is not None
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    globals_ = {"__builtins__": __builtins__, "__name__": __name__}
    defaults = (fn, *names.values())
    return FunctionType(new_code, globals_, "__next__", defaults)


def _supported(code: CodeType, defaults: tuple[Any, ...] | None) -> bool:
    """``self`` then parameters with defaults, nothing else; no closure, no generator, no name
    of ours."""
    return (
        not code.co_freevars
        and not any(name.startswith(PREFIX) for name in code.co_varnames + code.co_names)
        and not code.co_flags & _UNSUPPORTED
        and code.co_argcount >= 1
        and code.co_posonlyargcount == 0
        and code.co_kwonlyargcount == 0
        and len(defaults or ()) == code.co_argcount - 1
    )


def _recompiled_code(
    code: CodeType, globals_: dict[str, Any], names: tuple[str, ...], statements: Statements
) -> CodeType | None:
    filename = code.co_filename
    lines = linecache.getlines(filename, globals_)
    if not lines:
        return None
    try:
        tree = ast.parse("".join(lines), filename)
        found = [
            node
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef)
            and node.name == code.co_name
            and node.lineno == code.co_firstlineno
            and not node.decorator_list
        ]
        if len(found) != 1:
            return None
        name, line = code.co_name, code.co_firstlineno
        as_loaded = _find_code(compile(tree, filename, "exec", dont_inherit=True), name, line)
        if as_loaded != code:
            return None  # the source is not what was loaded (edited since, or another build)
        _instrument(found[0], names, statements)
        ast.fix_missing_locations(tree)
        return _find_code(compile(tree, filename, "exec", dont_inherit=True), name, line)
    except (SyntaxError, ValueError, TypeError, RecursionError):
        return None


def _find_code(module_code: CodeType, name: str, line: int) -> CodeType | None:
    """The code object of the function ``name`` defined at ``line``, searched through the
    module's nested code."""
    todo = [module_code]
    while todo:
        for const in todo.pop().co_consts:
            if isinstance(const, CodeType):
                if const.co_name == name and const.co_firstlineno == line:
                    return const
                todo.append(const)
    return None


def _instrument(
    definition: ast.FunctionDef, names: tuple[str, ...], statements: Statements
) -> None:
    """Put ``statements`` into ``definition`` and add ``names`` as defaulted parameters.

    The body runs inside ``while True:``, each ``return X`` becoming ``VALUE = X; break`` (and
    falling off the end ``VALUE = None; break``), so that ``on_return`` runs after the body has
    left every ``with`` and ``finally`` it was in, as it would after the call returned. Hence a
    ``return`` inside a loop of the body, where ``break`` would leave that loop, is refused.
    """
    if any(not name.startswith(PREFIX) for name in names):
        raise ValueError(f"names of a copy start with {PREFIX!r}: {names}")
    nodes = [node for stmt in definition.body for node in ast.walk(stmt)]
    if any(isinstance(node, _NESTED_SCOPES) for node in nodes):
        raise ValueError("a nested function or class keeps its own returns: not recompiled")
    loops = [node for node in nodes if isinstance(node, (ast.For, ast.AsyncFor, ast.While))]
    if any(isinstance(node, ast.Return) for loop in loops for node in ast.walk(loop)):
        raise ValueError("a return inside a loop: not recompiled")
    self_name = definition.args.args[0].arg
    first = definition.body[0]  # our statements carry its place in the file

    def parsed(source: str) -> list[ast.stmt]:
        body = ast.parse(source.format(self=self_name)).body
        for stmt in body:
            for node in ast.walk(stmt):
                if "lineno" in node._attributes:
                    ast.copy_location(node, first)
        return body

    class Returns(ast.NodeTransformer):
        def visit_Return(self, node: ast.Return) -> list[ast.stmt]:
            value = node.value or ast.copy_location(ast.Constant(None), node)
            target = ast.copy_location(ast.Name(VALUE, ast.Store()), node)
            assign = ast.copy_location(ast.Assign(targets=[target], value=value), node)
            return [assign, ast.copy_location(ast.Break(), node)]

    body = _flat([Returns().visit(stmt) for stmt in definition.body])
    body += parsed(f"{VALUE} = None\nbreak")
    loop = ast.copy_location(
        ast.While(ast.copy_location(ast.Constant(True), first), body, []), first
    )
    stop = ast.copy_location(ast.Name("StopIteration", ast.Load()), first)
    reraise = ast.copy_location(ast.Raise(), first)
    handler = ast.ExceptHandler(stop, None, [*parsed(statements.on_stop), reraise])
    attempt = ast.Try([loop], [ast.copy_location(handler, first)], [], [])
    definition.body = [
        *parsed(statements.entry),
        ast.copy_location(attempt, first),
        *parsed(statements.on_return),
    ]
    definition.args.args += [ast.copy_location(ast.arg(name), definition) for name in names]
    definition.args.defaults += [ast.copy_location(ast.Constant(None), definition) for _ in names]


def _flat(stmts: list[Any]) -> list[ast.stmt]:
    out: list[ast.stmt] = []
    for stmt in stmts:
        out.extend(stmt if isinstance(stmt, list) else [stmt])
    return out


def _function(code: CodeType, like: FunctionType, defaults: tuple[Any, ...]) -> FunctionType:
    fn = FunctionType(code, like.__globals__, like.__name__, defaults)
    fn.__qualname__ = like.__qualname__
    fn.__doc__ = like.__doc__
    fn.__wrapped__ = like  # type: ignore[attr-defined]
    return fn

"""The notebook's own code a cell runs: the functions and classes defined in other cells that the
cell names, and those their code names in turn, each as a hash of its source.

A cell that calls ``train(model, loader)`` runs the code of ``train``, of the model's class and
of the dataset's, all defined in other cells: editing one of them changes what the cell runs,
though not its text. Their hashes join the cell's source in the run's configuration, and what
changed names the one that did ("train changed (defined outside the cell)").

Followed: a name the cell reads, and does not bind itself, whose object is a function or class
defined in the notebook (``__module__ == "__main__"``), or an instance of such a class (``model =
Net()`` in another cell: ``Net``), or a DataLoader whose dataset, collate function or sampler is
(:data:`LOADER_PARTS`); from a function, the globals its code loads; from a class, its methods'
and its bases'. Not followed: modules, libraries, data. At most ``MAX_DEFINITIONS``.

The plain **values** those names and globals hold are kept too (:func:`value_text`: numbers,
booleans, ``None``, short tuples of them, torch dtypes and devices as written; strings only as
a hash, they may be secrets): ``HIDDEN = 512`` in a settings cell, read by ``make_model``, is
what changed when it became 1024. They are not part of the configuration (a run id or a
timestamp read by the cell would make every run a configuration of its own), only of what
changed.
"""

from __future__ import annotations

import ast
import dis
import hashlib
import inspect
import textwrap
import types
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

#: Definitions followed at most: a notebook's helpers, not a library of them.
MAX_DEFINITIONS = 64
_GLOBAL_LOADS = ("LOAD_GLOBAL", "LOAD_NAME")


class CellCode(NamedTuple):
    """What a cell runs beyond its text: ``definitions``, name -> 16 hex digits of SHA-256 of
    the source of each function and class; ``values``, name -> :func:`value_text` of each
    plain value read."""

    definitions: dict[str, str]
    values: dict[str, str]


def cell_code(code: str, namespace: Mapping[str, Any]) -> CellCode | None:
    """The notebook's definitions and values the cell's ``code`` (plain Python: IPython's
    ``transform_cell`` of the cell) uses, as they are in ``namespace`` (the kernel's user
    namespace) now; None where the code does not parse. Never raises for what the namespace
    holds: a definition whose source cannot be read is hashed by its compiled code."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return None
    read: set[str] = set()
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
    # a name the cell binds is its own code (an earlier run's object in the namespace is not)
    names = sorted(read - bound)
    found: dict[str, str] = {}
    values: dict[str, str] = {}
    seen: set[int] = set()
    queue = [(name, namespace.get(name)) for name in names if name in namespace]
    while queue and len(found) < MAX_DEFINITIONS:
        name, obj = queue.pop(0)
        target = _definition(obj)
        if target is None:
            parts = list(_parts(obj))
            if parts:  # a library's loader: what it runs of the notebook's code
                queue.extend(parts)
                continue
            text = value_text(obj)
            if text is not None and len(values) < MAX_DEFINITIONS:
                values[name] = text
            continue
        if id(target) in seen:
            continue
        seen.add(id(target))
        label = getattr(target, "__qualname__", name) if target is not obj else name
        found[label] = _hash(_source(target))
        queue.extend(_uses(target))
    return CellCode(dict(sorted(found.items())), dict(sorted(values.items())))


#: The longest value written as it is (longer ones are not kept: they are data, not settings).
MAX_VALUE_CHARS = 64


def value_text(value: Any) -> str | None:
    """A plain value as what changed shows it: a number, boolean or ``None`` as written
    (``512``, ``0.001``, ``True``), a tuple or list of those (``(3, 224, 224)``), a torch dtype
    or device (``torch.bfloat16``); a string as ``str:`` and 8 hex digits of its SHA-256 (it
    may be a secret); None for anything else or longer than ``MAX_VALUE_CHARS``."""
    if isinstance(value, str):
        return "str:" + hashlib.sha256(value.encode(errors="replace")).hexdigest()[:8]
    plain = (bool, int, float, type(None))
    torch_kind = type(value).__module__ == "torch" and type(value).__name__ in ("dtype", "device")
    if isinstance(value, (tuple, list)):
        shown = len(value) <= 8 and all(isinstance(v, plain) for v in value)
    else:
        shown = isinstance(value, plain) or torch_kind
    text = repr(value) if shown else ""
    return text if 0 < len(text) <= MAX_VALUE_CHARS else None


def _definition(obj: Any) -> Any:
    """The notebook's function or class ``obj`` is or is an instance of, else None."""
    if isinstance(obj, (types.FunctionType, type)):
        return obj if getattr(obj, "__module__", None) == "__main__" else None
    if isinstance(obj, types.ModuleType):
        return None
    cls = type(obj)
    return cls if getattr(cls, "__module__", None) == "__main__" else None


#: The attributes of a data loader (torch's, accelerate's) or of a dataset that views others
#: (``Subset``, ``ConcatDataset``) followed into the notebook's code: a cell that iterates a
#: ``loader`` built in another cell runs its dataset's ``__getitem__`` (an edit of that class
#: read "same code" before), its collate function, its sampler.
LOADER_PARTS = ("dataset", "datasets", "collate_fn", "worker_init_fn", "sampler", "batch_sampler")
#: The packages whose loaders and dataset views are followed so.
LOADER_PACKAGES = ("torch.utils.data", "accelerate")


def _parts(obj: Any) -> Iterator[tuple[str, Any]]:
    """The parts (:data:`LOADER_PARTS`) of a loader or dataset view of :data:`LOADER_PACKAGES`,
    as ``(name, object)``; nothing for anything else."""
    module = type(obj).__module__ or ""
    if not module.startswith(LOADER_PACKAGES):
        return
    for attr in LOADER_PARTS:
        value = getattr(obj, attr, None)
        for part in value[:MAX_DEFINITIONS] if isinstance(value, list) else [value]:
            if part is not None:
                yield getattr(part, "__qualname__", attr), part


def _functions(target: Any) -> Iterator[types.FunctionType]:
    """The function, or a class's own methods (properties', static and class methods' too)."""
    if isinstance(target, types.FunctionType):
        yield target
        return
    for value in vars(target).values():
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        elif isinstance(value, property):
            yield from (f for f in (value.fget, value.fset) if isinstance(f, types.FunctionType))
            continue
        if isinstance(value, types.FunctionType):
            yield value


def _uses(target: Any) -> Iterator[tuple[str, Any]]:
    """The globals the code of ``target`` names (its bases too, for a class), as
    ``(name, object)``."""
    if isinstance(target, type):
        yield from ((base.__qualname__, base) for base in target.__bases__)
    for function in _functions(target):
        scope = function.__globals__
        for name in sorted(_global_names(function.__code__)):
            if name in scope:
                yield name, scope[name]


def _global_names(code: types.CodeType) -> set[str]:
    """The global names ``code`` loads (not its attribute names: ``model.train()`` names no
    global ``train``), its nested functions', comprehensions' and lambdas' too."""
    names = {str(op.argval) for op in dis.get_instructions(code) if op.opname in _GLOBAL_LOADS}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def _source(target: Any) -> str:
    """The source of a function, or of a class's methods and the names of its bases; a
    function whose source is not in the line cache, by its compiled code."""
    parts = []
    if isinstance(target, type):
        parts.append(" ".join(base.__qualname__ for base in target.__bases__))
    for function in _functions(target):
        try:
            parts.append(textwrap.dedent(inspect.getsource(function)).strip())
        except (OSError, TypeError):
            code = function.__code__
            parts.append(repr((code.co_code, code.co_consts, code.co_names)))
    return "\n".join(parts)


def _hash(source: str) -> str:
    lines = [line.rstrip() for line in source.splitlines() if line.strip()]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]

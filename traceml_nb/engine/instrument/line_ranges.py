"""The lines of the profiled code as ``torch.profiler`` ranges, while a profile window is open.

``torch.profiler``'s own ``with_stack`` cannot name them: its Python tracer gives each Python
function's first line, not the line that called an operator, and in PyTorch 2.x its events
often fail to parse at all (``UnicodeDecodeError`` from frame names freed before the parse).
So while the window is open a trace function (``sys.settrace``, the training thread only)
runs each line of the profiled code's file (the ``%%traceml`` cell, or the script that started
the run) inside a ``record_function`` range named :data:`LINE_RANGE` + a key; an operator then
lies inside the range of the line that called it. The time of a range outside the operators
in it is the Python time of its line, the Python functions it calls included (a model's
``forward`` defined elsewhere). Frames of other files only pay the trace function's call.

The ranges exist only between :meth:`LineRanges.start` and :meth:`LineRanges.stop`; stop puts
the trace function that was there back. When another one is active (a debugger, coverage)
no range is made and :attr:`LineRanges.why` says so.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from types import FrameType
from typing import Any

#: The prefix of a line range's name; the rest is its key in :attr:`LineRanges.lines`.
LINE_RANGE = "traceml line "


@dataclass(frozen=True)
class CodeLine:
    """A line of user code: its file, number and function."""

    file: str
    line: int
    function: str

    def words(self) -> str:
        """``line 7`` at the top level of the code, ``line 5 in forward`` inside a function."""
        if self.function.startswith("<"):  # <module>, <listcomp>, <genexpr>
            return f"line {self.line}"
        return f"line {self.line} in {self.function}"


class LineRanges:
    """Ranges of the lines of ``code_file`` on the thread that calls :meth:`start`, until
    :meth:`stop`."""

    def __init__(self, code_file: str | None) -> None:
        self.code_file = code_file
        #: range key -> the line it stands for
        self.lines: dict[str, CodeLine] = {}
        self.why = ""  #: why no line was ranged ('' while they are)
        self._keys: dict[tuple[str, int], str] = {}
        self._stack: list[tuple[FrameType, Any]] = []  #: open ranges, innermost last
        self._traced: list[FrameType] = []  #: frames of the call stack given our f_trace
        self._previous: Any = None
        self._active = False
        self._range: Any = None

    def start(self, frame: FrameType | None) -> None:
        """Range the lines of the code file from now on: of frames called from now on, and of
        its frames on the stack from ``frame`` outwards."""
        if self.code_file is None:
            self.why = "the file of the profiled code is not known"
            return
        if sys.gettrace() is not None:
            self.why = "another trace function (a debugger, coverage) is active"
            return
        from torch.autograd.profiler import record_function

        self._range = record_function
        self._active = True
        while frame is not None:
            if frame.f_code.co_filename == self.code_file:
                frame.f_trace = self._local
                self._traced.append(frame)
            frame = frame.f_back
        sys.settrace(self._call)

    def stop(self) -> None:
        """No more ranges: the open ones are closed, the previous trace function is back."""
        if not self._active:
            return
        self._active = False
        sys.settrace(self._previous)
        for frame in self._traced:
            frame.f_trace = None
        self._traced.clear()
        while self._stack:
            _, opened = self._stack.pop()
            opened.__exit__(None, None, None)

    def _key(self, frame: FrameType) -> str:
        code = frame.f_code
        at = (code.co_filename, frame.f_lineno)
        key = self._keys.get(at)
        if key is None:
            line = CodeLine(code.co_filename, frame.f_lineno, code.co_name)
            key = f"{line.line} ({line.function}) #{len(self._keys)}"
            self._keys[at] = key
            self.lines[key] = line
        return key

    def _call(self, frame: FrameType, event: str, arg: Any) -> Any:
        if frame.f_code.co_filename == self.code_file and self._active:
            return self._local
        return None

    def _local(self, frame: FrameType, event: str, arg: Any) -> Any:
        if not self._active:
            return None
        stack = self._stack
        # this frame's range, and any left open above it (a frame that lost its tracing)
        for depth in range(len(stack) - 1, -1, -1):
            if stack[depth][0] is frame:
                while len(stack) > depth:
                    stack.pop()[1].__exit__(None, None, None)
                break
        if event == "line":
            opened = self._range(LINE_RANGE + self._key(frame))
            opened.__enter__()
            stack.append((frame, opened))
        return self._local

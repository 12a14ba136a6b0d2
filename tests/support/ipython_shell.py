"""The real IPython shell the magic's tests run cells in, with the extension loaded."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

from IPython.core.interactiveshell import InteractiveShell
from IPython.testing.globalipapp import start_ipython


@contextlib.contextmanager
def traceml_shell(setup: str, *, torch_threads: int | None = 1) -> Iterator[InteractiveShell]:
    """IPython's test shell (a TerminalInteractiveShell; an existing singleton is reused) with
    ``%load_ext traceml_nb`` and ``setup`` run, torch at ``torch_threads`` intra-op threads
    (None: as it is; a tiny model runs fastest on one, and steadiest on a busy 2-core machine).
    The extension is unloaded, the shell's namespaces and output cache cleared (the next
    module's tests start from a clean shell, and a million profiler events of one test no longer
    sit in every later collection of the suite's heap) and torch's threads put back after."""
    import torch

    shell = InteractiveShell.instance() if InteractiveShell.initialized() else start_ipython()
    shell.run_line_magic("load_ext", "traceml_nb")
    threads = torch.get_num_threads()
    try:
        result = shell.run_cell(setup)
        assert result.success, result.error_in_exec
        if torch_threads is not None:
            torch.set_num_threads(torch_threads)
        yield shell
    finally:
        torch.set_num_threads(threads)
        shell.run_line_magic("unload_ext", "traceml_nb")
        shell.reset(new_session=False)
        # the last error's frames hold its cell's objects: in sys and where %debug finds them
        shell.InteractiveTB.tb = None
        for name in ("last_type", "last_value", "last_traceback", "last_exc"):
            if hasattr(sys, name):
                setattr(sys, name, None)

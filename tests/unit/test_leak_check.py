"""The leak check itself can fail; the shared test shell lets go of what a test left in it."""

import gc
import threading
import weakref

from ipython_shell import traceml_shell
from leakcheck import ORIGINAL_NEXT, force_clean, leak_report
from torch.utils.data.dataloader import _BaseDataLoaderIter

from traceml_nb.engine.instrument import hooks


def test_leak_report_sees_a_patch_and_a_thread():
    _BaseDataLoaderIter.__next__ = lambda self: None
    stop = threading.Event()
    t = threading.Thread(target=stop.wait, name="traceml-test-leak", daemon=True)
    t.start()
    try:
        problems = leak_report()
    finally:
        _BaseDataLoaderIter.__next__ = ORIGINAL_NEXT
        stop.set()
        t.join()
    assert any("patched" in p for p in problems)
    assert any("threads" in p for p in problems)
    assert leak_report() == []
    assert not hooks.is_installed()


def test_leak_report_sees_an_optimizer_hook_of_ours_left_registered():
    import torch.optim.optimizer as optim_mod

    from traceml_nb.engine.instrument.tracer import StepTracer
    from traceml_nb.engine.record import RunRecord

    handle = optim_mod.register_optimizer_step_post_hook(StepTracer(RunRecord()).optimizer_hook())
    try:
        problems = leak_report()
    finally:
        handle.remove()
    assert any("optimizer step hook" in p for p in problems)
    assert leak_report() == []


def test_a_thread_left_running_fails_the_test_that_left_it_and_no_later_one():
    stop = threading.Event()
    t = threading.Thread(target=stop.wait, name="traceml-test-stuck", daemon=True)
    t.start()
    try:
        assert any("traceml-test-stuck" in p for p in leak_report(grace_s=0.1))
        force_clean()  # what the autouse check does before failing the test
        assert leak_report(grace_s=0.1) == []  # the next test is not failed for it
    finally:
        stop.set()
        t.join()


def test_the_shared_shell_lets_go_of_a_tests_objects_and_its_last_error():
    """IPython's test shell is one for the whole suite: what a test's cells made must not live
    on in its namespace, nor in the last error's frames (every later collection of the suite's
    heap would walk it)."""
    setup = "import weakref\nclass Kept:\n    pass\nkept = Kept()\nrefs = []"
    failing = (
        "def fail():\n"
        "    held = Kept()  # only this frame holds it\n"
        "    refs.append(weakref.ref(held))\n"
        "    raise ValueError('on purpose')\n"
        "fail()"
    )
    with traceml_shell(setup) as shell:
        refs = shell.user_ns["refs"]
        refs.append(weakref.ref(shell.user_ns["kept"]))
        assert not shell.run_cell(failing).success
    gc.collect()
    assert [ref() for ref in refs] == [None, None]
    assert "kept" not in shell.user_ns

"""The leak check itself can fail."""

import threading

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

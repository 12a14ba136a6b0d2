"""The leak check itself can fail."""

import threading

from leakcheck import ORIGINAL_NEXT, leak_report
from torch.utils.data.dataloader import _BaseDataLoaderIter

from traceml_nb.instrument import patches


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
    assert not patches.is_installed()


def test_leak_report_sees_the_optimizer_counting_left_in_place():
    from leakcheck import ORIGINAL_STEP_CODE
    from torch.optim.optimizer import Optimizer

    Optimizer._optimizer_step_code = lambda self: None
    try:
        problems = leak_report()
    finally:
        Optimizer._optimizer_step_code = ORIGINAL_STEP_CODE
    assert any("_optimizer_step_code" in p for p in problems)
    assert leak_report() == []

"""The environment variables traceml_nb reads, in one place: their names, and one reader each.

=========================  ====================================================================
``TRACEML_NB_STORE``       the run store: a path, or ``off`` (``--store``/``--no-store`` first)
``TRACEML_NB_LOG_TO``      the trackers every run is logged to, as ``--log-to`` takes them
``TRACEML_NB_PROFILE_DIR`` where the ``--profile`` traces go (``--profile-dir`` first)
``TRACEML_NB_GPU_PRICE``   the price of a GPU-hour: ``0.53``, or ``T4=0.35,A100=2.9``
``XDG_DATA_HOME``          the XDG base directory the default store is under
=========================  ====================================================================

Each is read when it is used, never cached: a notebook may set one between two cells. The
variables of other programs that traceml_nb passes on or looks at (``RANK``, ``WORLD_SIZE`` of
``torchrun``, ``VSCODE_PID``, ``WANDB_API_KEY``, ...) are read where they are understood.
"""

from __future__ import annotations

import os

STORE_ENV = "TRACEML_NB_STORE"
LOG_TO_ENV = "TRACEML_NB_LOG_TO"
PROFILE_DIR_ENV = "TRACEML_NB_PROFILE_DIR"
GPU_PRICE_ENV = "TRACEML_NB_GPU_PRICE"
XDG_DATA_HOME_ENV = "XDG_DATA_HOME"


def store_setting() -> str:
    """``TRACEML_NB_STORE``, stripped ('' when unset)."""
    return os.environ.get(STORE_ENV, "").strip()


def log_to_setting() -> str | None:
    """``TRACEML_NB_LOG_TO`` as set (None when unset)."""
    return os.environ.get(LOG_TO_ENV)


def profile_dir_setting() -> str:
    """``TRACEML_NB_PROFILE_DIR``, stripped ('' when unset)."""
    return os.environ.get(PROFILE_DIR_ENV, "").strip()


def gpu_price_setting() -> str | None:
    """``TRACEML_NB_GPU_PRICE`` as set (None when unset)."""
    return os.environ.get(GPU_PRICE_ENV)


def xdg_data_home() -> str:
    """``XDG_DATA_HOME`` as set ('' when unset)."""
    return os.environ.get(XDG_DATA_HOME_ENV, "")

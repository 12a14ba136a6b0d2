"""Fixtures for the real-browser tests: a JupyterLab 4 server and headless Chromium.

The server runs from this virtualenv (its kernelspec starts this virtualenv's Python, and the
ipywidgets and jupyter_bokeh lab extensions come from its ``share/jupyter``), with temporary
``JUPYTER_*`` directories, a fixed token, on 127.0.0.1 and a free port, with news and update
checks switched off, and with the application exposed as ``window.jupyterapp`` (in JupyterLab
and in Notebook 7) so that the tests can wait on the notebook's session and run its commands.
Chromium is Debian's ``/usr/bin/chromium`` driven by Playwright.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from lab_server import stop, wait_for_status

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TOKEN = "traceml-browser-test"
SERVER_START_TIMEOUT_S = 90.0
VENV_BIN = Path(sys.executable).parent

#: User settings that keep JupyterLab quiet: no news toast, no update check.
LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false",
        "checkForUpdates": False,
    },
}


@dataclass
class LabServer:
    url: str  #: e.g. http://127.0.0.1:8890
    token: str
    root: Path  #: the server's root directory (notebooks go here)
    log: Path

    def notebook_url(self, name: str) -> str:
        return f"{self.url}/lab/tree/{name}?token={self.token}&reset"

    def sessions(self) -> list[dict]:
        """The server's sessions (``GET /api/sessions``): each with its path and its kernel."""
        req = urllib.request.Request(
            f"{self.url}/api/sessions", headers={"Authorization": f"token {self.token}"}
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def chromium_path() -> Path:
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing (Debian package 'chromium')")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.skip("playwright (Python) is not installed")
    return CHROMIUM


@pytest.fixture(scope="module")
def lab_server(
    chromium_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LabServer]:
    """A JupyterLab 4 server for the browser tests of one module, stopped (with its kernels)
    when they are done, so that no process of it outlives them into other tests."""
    base = tmp_path_factory.mktemp("jupyter")
    root = base / "root"
    dirs = {name: base / name for name in ("config", "data", "runtime", "settings", "workspaces")}
    for path in [root, *dirs.values()]:
        path.mkdir()
    for name, value in LAB_SETTINGS.items():
        target = dirs["settings"] / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(value))
    env = dict(os.environ)
    env.update(
        JUPYTER_CONFIG_DIR=str(dirs["config"]),
        JUPYTER_DATA_DIR=str(dirs["data"]),
        JUPYTER_RUNTIME_DIR=str(dirs["runtime"]),
        # the venv's share/jupyter (kernelspec, lab extensions) is on the path anyway, as the
        # server runs from the venv; naming it keeps that true if a parent env sets JUPYTER_PATH
        JUPYTER_PATH=str(Path(sys.prefix) / "share" / "jupyter"),
        JUPYTER_PLATFORM_DIRS="1",
        PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",
        PYTHONUNBUFFERED="1",
    )
    env.pop("JUPYTER_PREFER_ENV_PATH", None)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = base / "lab.log"
    cmd = [
        str(VENV_BIN / "jupyter"),
        "lab",
        "--allow-root",
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={port}",
        "--port-retries=0",
        f"--IdentityProvider.token={TOKEN}",
        "--ServerApp.open_browser=False",
        f"--ServerApp.root_dir={root}",
        f"--LabApp.user_settings_dir={dirs['settings']}",
        f"--LabApp.workspaces_dir={dirs['workspaces']}",
        "--LabApp.news_url=None",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        # window.jupyterapp: the tests wait on the notebook's session context and run cells by
        # its commands (the page's own state, not a status icon that reads "idle" before any
        # kernel exists)
        "--LabApp.expose_app_in_browser=True",
        "--JupyterNotebookApp.expose_app_in_browser=True",
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, env=env, cwd=root, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for_status(url, TOKEN, proc, log, SERVER_START_TIMEOUT_S)
        yield LabServer(url=url, token=TOKEN, root=root, log=log)
    finally:
        stop(proc)
        shutil.rmtree(dirs["runtime"], ignore_errors=True)


@pytest.fixture
def page(chromium_path: Path, tmp_path: Path):
    """A fresh headless Chromium page (1400×1000)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=str(chromium_path),
            headless=True,
            args=CHROMIUM_FLAGS,
        )
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 1000})
            pg = context.new_page()
            pg.set_default_timeout(60_000)
            yield pg
        finally:
            browser.close()

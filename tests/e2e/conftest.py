"""Fixtures for end-to-end tests with the official Python clients.

Real processes on loopback: the simulated LLM upstream (`idemgate-llm-sim`)
and the gateway (`idemgate serve`), both built by cargo before pytest runs.
The tests talk to the gateway through the official `openai` and `anthropic`
packages and read the upstream's execution counters over HTTP.
"""

import json
import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
PROFILE = os.environ.get("IDEMGATE_PROFILE", "debug")


def _bin(name: str) -> str:
    path = TARGET / PROFILE / name
    if not path.exists():
        raise RuntimeError(f"{path} is missing: build it with `cargo build -p {name}` first")
    return str(path)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except Exception as e:  # not up yet
            last = e
        time.sleep(0.05)
    raise RuntimeError(f"{url} never answered: {last}")


class Sim:
    def __init__(self, url: str):
        self.url = url

    def stats(self) -> dict:
        with urllib.request.urlopen(f"{self.url}/sim/stats", timeout=5) as r:
            return json.load(r)

    def executions_for(self, key: str) -> int:
        with urllib.request.urlopen(f"{self.url}/sim/executions/{key}", timeout=5) as r:
            body = json.load(r)
        return body["executions"] if isinstance(body, dict) else int(body)


@pytest.fixture(scope="session")
def sim():
    port = _free_port()
    proc = subprocess.Popen(
        [_bin("idemgate-llm-sim"), "--listen", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_http(f"{url}/sim/stats")
        yield Sim(url)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="session")
def gateway(sim, tmp_path_factory):
    port, admin = _free_port(), _free_port()
    db = tmp_path_factory.mktemp("gw") / "idemgate.db"
    proc = subprocess.Popen(
        [
            _bin("idemgate"),
            "serve",
            "--upstream",
            sim.url,
            "--listen",
            f"127.0.0.1:{port}",
            "--admin-listen",
            f"127.0.0.1:{admin}",
            "--store",
            f"sqlite:{db}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_http(f"http://127.0.0.1:{admin}/healthz")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0, "gateway did not shut down cleanly"

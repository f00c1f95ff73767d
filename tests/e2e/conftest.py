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


def _serve(sim: Sim, workdir: Path, config: str | None = None):
    """Starts `idemgate serve` in front of the simulator; yields its base URL."""
    port, admin = _free_port(), _free_port()
    args = [
        _bin("idemgate"),
        "serve",
        "--upstream",
        sim.url,
        "--listen",
        f"127.0.0.1:{port}",
        "--admin-listen",
        f"127.0.0.1:{admin}",
        "--store",
        f"sqlite:{workdir / 'idemgate.db'}",
    ]
    if config is not None:
        path = workdir / "idemgate.toml"
        path.write_text(config)
        args += ["--config", str(path)]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_http(f"http://127.0.0.1:{admin}/healthz")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0, "gateway did not shut down cleanly"


@pytest.fixture(scope="session")
def gateway(sim, tmp_path_factory):
    """The defaults: every path one route, a duplicate of a running key waits."""
    yield from _serve(sim, tmp_path_factory.mktemp("gw"))


# Two routes in front of the same simulator, told apart by a path prefix
# that is stripped before forwarding: `/reject` answers a duplicate of a
# running key with 409 at once, `/charging` is a `charges = true` route
# whose upstream gets 1 s for its first byte (then `outcome-unknown`).
ROUTES = """
[[routes]]
id = "reject"
prefix = "/reject"
strip_prefix = true
upstream = "{sim}"
on_inflight = "reject"

[[routes]]
id = "charging"
prefix = "/charging"
strip_prefix = true
upstream = "{sim}"
charges = true

[routes.timeouts]
first_byte = "1s"
"""


@pytest.fixture(scope="session")
def routes(sim, tmp_path_factory):
    """Base URL of a gateway with the `/reject` and `/charging` routes."""
    yield from _serve(sim, tmp_path_factory.mktemp("gw-routes"), ROUTES.format(sim=sim.url))

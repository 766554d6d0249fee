"""The platform as ``serving up`` runs it for an LLM benchmark: control plane, the LLM launcher and one
worker, each in a process group of its own, on free ports; statistics and client keys off, so what is
measured is the serving path and the engines (benchmarks/llm_routing.py, benchmarks/llm_lora.py)."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import httpx

from benchmarks.procs import REPO, child_env, free_port, stop, wait_http


class LLMStack:
    def __init__(self, root: Path) -> None:
        self.root, self.procs = root, []
        ports = {k: free_port() for k in ("cp", "worker", "launcher")}
        home = root / "home"
        home.mkdir(parents=True, exist_ok=True)
        self.launcher = f"http://127.0.0.1:{ports['launcher']}"
        self.worker = f"http://127.0.0.1:{ports['worker']}"
        self.env = child_env({"SERVING_HOME": str(home), "SERVING_CREDENTIALS": str(home / "credentials"),
                              "SERVING_CONTROL_PLANE_PORT": str(ports["cp"]),
                              "SERVING_CONTROL_PLANE_URL": f"http://127.0.0.1:{ports['cp']}",
                              "SERVING_WORKER_PORT": str(ports["worker"]), "SERVING_WORKER_GRPC_PORT": "0",
                              "SERVING_WORKER_CACHE": str(home / "worker.json"),
                              "SERVING_LLM_LAUNCHER_PORT": str(ports["launcher"]),
                              "SERVING_LLM_LAUNCHER_URL": self.launcher,
                              "SERVING_STATISTICS_ENABLED": "false", "SERVING_CLIENT_KEYS_REQUIRED": "false",
                              "SERVING_TOKEN": None, "SERVING_ADMIN_TOKEN": None, "SERVING_WORKER_TOKEN": None,
                              "PYTHONUNBUFFERED": "1"})

    def spawn(self, name: str, *args: str) -> subprocess.Popen:
        log = open(self.root / f"{name}.log", "ab")
        proc = subprocess.Popen([sys.executable, "-m", "serving.cli.main", *args], env=self.env, cwd=REPO,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        return proc

    def cli(self, *args: str) -> None:
        subprocess.run([sys.executable, "-m", "serving.cli.main", *args], env=self.env, cwd=REPO, check=True,
                       capture_output=True, timeout=900)

    def start(self) -> None:
        cp = self.spawn("control-plane", "control-plane")
        wait_http(f"{self.env['SERVING_CONTROL_PLANE_URL']}/health", 120, [cp])
        launcher = self.spawn("llm", "llm")
        wait_http(f"{self.launcher}/health", 120, [launcher])
        worker = self.spawn("worker", "worker")
        wait_http(f"{self.worker}/v2/health/live", 120, [worker])

    def deploy(self, endpoint: str, model: str, options: list[str]) -> None:
        """``model add --engine vllm`` with these ``--aux-config`` options."""
        self.cli("model", "add", "--engine", "vllm", "--endpoint", endpoint, "--model", model, "--aux-config", *options)

    def engine(self, key: str) -> dict:
        return httpx.get(f"{self.launcher}/engines", timeout=10).json()["engines"].get(key, {})

    def wait_ready(self, key: str, timeout: float = 900, adapters: int = 0) -> None:
        """Every replica of engine ``key`` answers, with ``adapters`` LoRA adapters loaded in it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            replicas = self.engine(key).get("replicas")
            if replicas and all(r["state"] == "ready" for r in replicas) and \
                    all(len(r.get("adapters") or []) >= adapters for r in replicas):
                return
            time.sleep(2)
        raise SystemExit(f"engine {key} did not start; see {self.root}/llm.log")

    def stop(self) -> None:
        for proc in reversed(self.procs):
            stop(proc)


def corpus_words() -> list[str]:
    """The words prompts are made of: the test tokenizer's corpus, so each is a token or a few."""
    from serving.testmodels_llm import CORPUS

    return sorted({w for line in CORPUS for w in line.split()})


def save(result: dict, out: Path, name: str, plot: Callable[[dict, Path], None]) -> None:
    """``<out>/<name>.json`` and the plot beside it, ``<name>.png``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(result, indent=2))
    plot(result, out / f"{name}.png")

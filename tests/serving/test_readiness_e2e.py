"""Readiness-gated routing (issue 19): under steady load, every kind of deploy costs 0 failed requests.

Real processes on loopback: the control plane, the statistics service (the rollout reads it), two
worker processes (two `serving worker`s, so each client knows which process it reaches), and for the Triton engine the embedded Triton. A few
closed-loop clients send the same text the whole time; every answer must be a 200 from the version
the routes allow, with that version's logits (checked against onnxruntime run directly). Across:
a replacing deploy (no --canary), a canary promoted, a canary rolled back, a progressive rollout, an
auto-update to a newly uploaded version, and a version whose ONNX cannot be loaded (the old one keeps
answering, `--wait` exits 1 naming the failure, `serving endpoint list` shows it). `--wait` returns
only once the version answers: a brand-new endpoint answers its first request after it.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import onnx
import pytest

from serving.testmodels import build_bert_classifier
from tests.serving.stack import Stack, make_stack
from tests.serving.test_stack_e2e import reference_logits
from tests.support.procs import wait_until

TEXT = "a steady stream of requests during a deploy"
CLIENTS = 3
# Between one client's requests: unpaced, the three clients kept both cores of the test machine busy (240
# requests/s, 190 s of CPU for the onnxruntime case) and slowed the rest of the suite; paced, each still
# sends about 40 a second through every switch, each switch lasting far longer than 25 ms.
PAUSE_S = 0.025


@dataclass
class Load:
    """Closed-loop clients on keep-alive connections; each answer kept as (time, status, version, logits)."""

    urls: list[str]  # the clients spread over them (one per worker process)
    results: list[tuple[float, int, str, object]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> "Load":
        for i in range(CLIENTS):
            t = threading.Thread(target=self._run, args=(self.urls[i % len(self.urls)],), daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def _run(self, url: str) -> None:
        with httpx.Client(timeout=30) as client:
            while not self._stop.is_set():
                try:
                    r = client.post(url, json={"text": TEXT})
                    body = r.json().get("logits") if r.status_code == 200 else r.text[:200]
                    self.results.append((time.monotonic(), r.status_code, r.headers.get("X-Model-Version", ""), body))
                except (httpx.HTTPError, ValueError) as exc:
                    self.results.append((time.monotonic(), -1, "", f"{type(exc).__name__}: {exc}"))
                self._stop.wait(PAUSE_S)

    def versions_since(self, t0: float) -> list[str]:
        return [v for t, s, v, _ in list(self.results) if t >= t0 and s == 200]

    def only(self, version: int, last: int = 12) -> bool:
        """The last ``last`` answers all came from ``version``."""
        recent = self.versions_since(0)[-last:]
        return len(recent) == last and set(recent) == {str(version)}

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(40)


def broken_onnx(bundle, dest: Path) -> Path:
    """The tiny model with one operator renamed to one no runtime has: a readable ONNX file with the right
    signature (the registry accepts it) that no onnxruntime session can load (Triton's neither)."""
    model = onnx.load(str(bundle.onnx_path))
    model.graph.node[0].op_type = "NoSuchOperator"
    onnx.save(model, str(dest))
    return dest


@pytest.fixture(scope="module")
def model_b(tmp_path_factory):
    return build_bert_classifier(tmp_path_factory.mktemp("tiny-bert-b"), seed=1)


def start_stack(home: Path, triton: bool) -> Stack:
    home.mkdir(parents=True, exist_ok=True)
    stack = make_stack(home, workers=2)
    stats_port = stack.env["SERVING_STATISTICS_PORT"]
    stack.env["SERVING_STATISTICS_URL"] = f"http://127.0.0.1:{stats_port}"
    return stack.start_components(triton=triton)  # two worker processes, each on its own port


def show_logs(stack: Stack) -> None:
    """On a failure: what the processes said (pytest's temporary directories do not last)."""
    for log in sorted(stack.home.glob("*.log")):
        print(f"--- {log.name} (tail) ---\n{log.read_text(errors='replace')[-4000:]}")


def run_every_kind_of_deploy(stack: Stack, engine: str, bundles: dict[int, object], tmp_path: Path) -> dict:
    """Versions 1, 3, 5 are model a, 2, 4, 6 model b (other weights): each answer's logits tell them apart."""
    report: dict[str, object] = {}
    tok = str(bundles[1].tokenizer_dir)
    add = ("model", "add", "--endpoint", "w", "--engine", engine, "--tokenizer", tok)
    for v in range(1, 6):
        stack.cli("model", "upload", "--name", "clf", "--path", str(bundles[v].onnx_path))
    expected = {str(v): reference_logits(bundles[v], [TEXT])[0] for v in range(1, 7)}

    # a brand-new endpoint with --wait: answers its very first request once the command returns
    t0 = time.monotonic()
    out = stack.cli(*add, "--model", "clf:1", "--wait").stdout
    report["new endpoint --wait s"] = round(time.monotonic() - t0, 2)
    assert "ready" in out, out
    for i in (0, 1):  # on both worker processes
        r = httpx.post(f"{stack.worker_url(i)}/serve/w", json={"text": TEXT}, timeout=30)
        assert r.status_code == 200 and r.headers["X-Model-Version"] == "1", (i, r.status_code, r.text)

    load = Load([f"{stack.worker_url(i)}/serve/w" for i in (0, 1)]).start()
    try:
        wait_until(lambda: len(load.results) >= 20, 60, "load running")

        # 1. replacing deploy (no --canary): the CLI says the switch is pending; v2 takes over by itself
        out = stack.cli(*add, "--model", "clf:2").stdout
        assert "once the new version is ready" in out, out
        wait_until(lambda: load.only(2), 60, "v2 answers alone", interval=0.1)

        # 2. a canary, then promote
        stack.cli(*add, "--model", "clf:3", "--canary", "50%", "--wait")
        t0 = time.monotonic()
        wait_until(lambda: "3" in load.versions_since(t0), 30, "the canary answers", interval=0.1)
        stack.cli("canary", "promote", "--endpoint", "w")
        wait_until(lambda: load.only(3), 30, "v3 answers alone after promote", interval=0.1)

        # 3. a canary, then roll back
        stack.cli(*add, "--model", "clf:4", "--canary", "50%", "--wait")
        t0 = time.monotonic()
        wait_until(lambda: "4" in load.versions_since(t0), 30, "the canary answers", interval=0.1)
        stack.cli("canary", "rollback", "--endpoint", "w")
        wait_until(lambda: load.only(3), 30, "v3 answers alone after rollback", interval=0.1)

        # 4. a progressive rollout to v5: its first step adds v5, its last promotes it
        stack.cli("rollout", "start", "--endpoint", "w", "--model", "clf:5", "--steps", "50,100",
                  "--interval", "1s")
        wait_until(lambda: load.only(5), 90, "v5 answers alone after the rollout", interval=0.2)

        # 5. auto-update: the endpoint follows the newest version; a new upload takes over
        stack.cli("model", "auto-update", "--endpoint", "w", "--engine", engine, "--tokenizer", tok,
                  "--model", "clf", "--max-versions", "1", "--wait")
        stack.cli("model", "upload", "--name", "clf", "--path", str(bundles[6].onnx_path))
        wait_until(lambda: load.only(6), 60, "the new upload v6 answers alone", interval=0.1)

        # 6. a version that cannot be loaded: --wait says so, v6 keeps answering, the state shows it
        stack.cli("model", "upload", "--name", "bad", "--path", str(broken_onnx(bundles[1], tmp_path / "bad.onnx")))
        t0 = time.monotonic()
        res = stack.cli(*add, "--model", "bad:1", "--wait", "--wait-timeout", "60", check=False)
        report["failed load reported after s"] = round(time.monotonic() - t0, 1)
        assert res.returncode == 1 and "failed" in res.stdout, (res.returncode, res.stdout, res.stderr)
        listing = stack.cli("endpoint", "list").stdout
        assert "failed" in listing, listing
        t1 = time.monotonic()
        wait_until(lambda: len(load.versions_since(t1)) >= 20, 30, "answers after the failed deploy")
        assert set(load.versions_since(t0)) == {"6"}
    finally:
        load.stop()

    results = list(load.results)
    failed = [(s, v, b) for _, s, v, b in results if s != 200]
    report.update(requests=len(results), non_200=len(failed))
    assert not failed, f"{len(failed)} of {len(results)} answers were not 200: {failed[:5]}"
    for _, _, version, logits in results:  # a 200 must carry its version's answer
        np.testing.assert_allclose(logits, expected[version], atol=1e-4)
    print(f"{engine}:", report)
    return report


@pytest.mark.timeout(900)
@pytest.mark.parametrize("engine", ["triton", "onnxruntime"])
def test_every_deploy_kind_costs_no_request(tmp_path, tiny_model, model_b, engine):
    stack = start_stack(tmp_path / "home", triton=engine == "triton")
    try:
        bundles = {v: tiny_model if v % 2 else model_b for v in range(1, 7)}
        try:
            run_every_kind_of_deploy(stack, engine, bundles, tmp_path)
        except BaseException:
            show_logs(stack)
            raise
        status = httpx.get(f"{stack.control_plane}/endpoints/w/status", headers=stack.headers(), timeout=10).json()
        assert status["state"] == "failed" and len(status["workers"]) == 2, status  # one report per worker process
        if engine == "triton":  # the embedded Triton reports the load failure
            assert "Triton could not load bad_v1" in status["error"], status
        else:  # each worker process's onnxruntime does, and keeps serving version 6
            assert all("NoSuchOperator" in (w["error"] or "") for w in status["workers"]), status
            assert all(w["serving"] == [[6, 100.0, "stable"]] for w in status["workers"]), status
    finally:
        stack.stop_all()

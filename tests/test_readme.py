"""The README is executable documentation: its Quick start runs as written, on a fresh copy of the
repository and a fresh SERVING_HOME, and each answer is checked.

The bash block is typed line by line into one bash, as a user types it into a terminal: `source`
carries over to the next lines, `serving up ... &` runs in the background of that shell. The
commands are the README's bytes, never rewritten. So that the block's fixed ports (8080, 9090, ...)
cannot clash with anything else on the machine (other tests, other stacks), that bash runs in a
network namespace of its own (``unshare --net``, loopback only); the test looks into it with
``nsenter --net``. Without namespaces the block runs on the host's ports when they are free.

Checked: the set-up activates the project's venv; `serving demo --export` writes loadable models
and the tokenizer; the stack comes up (the one wait the test adds: until the control plane and a
worker answer, as a user waits for `serving up`'s `started` lines; the `model add` lines carry
`--wait`, so the curl and the canary's traffic follow them at once); each upload registers the
next version; the curl answer
is a JSON with a correct label whose logits equal onnxruntime run directly on the exported
model (same tokenizer); the canary line really splits traffic (the control plane's routes, and
the share of live answers served by version 2 within a binomial bound); promote moves every
answer to version 2, which again equals onnxruntime on model-v2.onnx.

The README's Python block (exporting one's own Hugging Face model with torch.onnx.export) is
run as written too, on a small BERT saved with save_pretrained, and its model is checked against
PyTorch and against what the registry reads and refuses.
"""
from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.support.ci import cannot_run
from tests.support.terminal import (REPO, Shell, command_lines, fresh_clone, json_answer, netns_works,
                                    section_blocks, step, taken_ports, user_env, venv_is_current)

README = REPO / "README.md"
LOGITS_ATOL = 1e-4


def quick_start() -> list[str]:
    (block,) = section_blocks(README.read_text(), "Quick start", "bash")
    return command_lines(block)


def test_the_quick_start_starts_where_a_fresh_clone_starts():
    """Its first line sets up and activates; it produces every file it later names; the top of
    the README still opens with `make demo` and `make test`."""
    lines = quick_start()
    assert lines[0] == "make setup && source .venv/bin/activate"
    assert lines[1].startswith("serving demo --export ")
    exported = shlex.split(lines[1].split("#")[0])[3]
    for line in lines[2:]:
        words = shlex.split(line.split("#")[0])
        for flag in ("--path", "--tokenizer"):
            if flag in words:
                assert words[words.index(flag) + 1].startswith(f"{exported}/"), line
    first = re.search(r"^```bash\n(.*?)^```$", README.read_text(), flags=re.MULTILINE | re.DOTALL).group(1)
    assert [c.split("#")[0].strip() for c in command_lines(first)] == ["make demo", "make test"]


# --- looking into the shell's network -----------------------------------------------------------

PROBE = r'''
import json, sys, time
import httpx
from pathlib import Path

args = json.loads(sys.stdin.read())

def wait_ok(urls, timeout):
    deadline = time.monotonic() + timeout
    for url in urls:
        while True:
            try:
                if httpx.get(url, timeout=3).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                return {"ok": False, "url": url}
            time.sleep(0.3)
    return {"ok": True}

def endpoints(home):
    from serving.credentials import read_token_file, token_file
    token = read_token_file(token_file(Path(home), "admin"))
    return httpx.get("http://127.0.0.1:8080/endpoints", headers={"Authorization": f"Bearer {token}"}, timeout=10).json()

def serve(path, text, n):
    out = []
    with httpx.Client(timeout=30) as client:
        for _ in range(n):
            r = client.post(f"http://127.0.0.1:9090{path}", json={"text": text})
            out.append([r.status_code, r.headers.get("X-Model-Version"), r.json() if r.status_code == 200 else r.text])
    return out

def until_version(path, text, version, streak, timeout):
    """Serve until `streak` answers in a row came from `version`."""
    deadline, row = time.monotonic() + timeout, 0
    with httpx.Client(timeout=30) as client:
        while time.monotonic() < deadline:
            r = client.post(f"http://127.0.0.1:9090{path}", json={"text": text})
            row = row + 1 if r.status_code == 200 and r.headers.get("X-Model-Version") == version else 0
            if row >= streak:
                return {"ok": True}
            time.sleep(0.05)
    return {"ok": False}

print(json.dumps(globals()[args.pop("fn")](**args)))
'''


def probe(shell: Shell, fn: str, **kwargs):
    out = subprocess.run([*shell.prefix(), sys.executable, "-c", PROBE], input=json.dumps({"fn": fn, **kwargs}),
                         capture_output=True, text=True, timeout=600, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def reference_logits(model: Path, tokenizer: Path, text: str) -> np.ndarray:
    """The exported model run directly: onnxruntime, the same tokenizer, one text."""
    import onnxruntime as ort
    from transformers import AutoTokenizer

    enc = AutoTokenizer.from_pretrained(str(tokenizer))([text], truncation=True, max_length=128, return_tensors="np")
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return session.run(None, {i.name: enc[i.name].astype(np.int64) for i in session.get_inputs()})[0][0]


def assert_same_answer(body: dict, model: Path, tokenizer: Path, text: str) -> None:
    expected = reference_logits(model, tokenizer, text)
    got = np.asarray(body["logits"], dtype=np.float64).reshape(-1)
    assert np.abs(got - expected).max() <= LOGITS_ATOL, (got, expected)
    assert body["label"] == ["NEGATIVE", "POSITIVE"][int(expected.argmax())], body


# --- the Quick start ----------------------------------------------------------------------------

@pytest.mark.timeout(1500)
def test_the_quick_start_runs_as_written(tmp_path):
    if not venv_is_current():
        cannot_run("the .venv was installed for another pyproject.toml or scripts/setup.sh: run `make setup`")
    for tool in ("make", "curl"):
        if shutil.which(tool) is None:
            cannot_run(f"`{tool}` is not installed (scripts/setup.sh installs curl)")
    netns = netns_works()
    if not netns and taken_ports():
        cannot_run(f"no network namespace here (unshare --net), and the Quick start's ports {taken_ports()} are taken")
    clone = fresh_clone(tmp_path / "clone")
    env = user_env(tmp_path)
    lines = quick_start()
    shell = Shell(clone, env, tmp_path / "terminal.log", netns)
    try:
        run_quick_start(shell, lines, clone, Path(env["SERVING_HOME"]))
    finally:
        shell.close()
        for big in ("quickstart", ".serving"):  # about 360 MB of models; pytest keeps its last temp dirs
            shutil.rmtree(clone / big, ignore_errors=True)


def run_quick_start(shell: Shell, lines: list[str], clone: Path, home: Path) -> None:
    it = iter(lines)
    step(shell, next(it), timeout=600)  # make setup && source .venv/bin/activate
    where = step(shell, "command -v serving").strip()
    assert Path(where).resolve() == (clone / ".venv" / "bin" / "serving").resolve(), where  # the venv is active

    export = next(it)
    step(shell, export, timeout=900)
    folder = clone / shlex.split(export.split("#")[0])[3]
    model, model_v2, tokenizer = folder / "model.onnx", folder / "model-v2.onnx", folder / "tokenizer"
    assert model.stat().st_size > 1e6 and model_v2.stat().st_size > 1e6 and (tokenizer / "tokenizer.json").exists()

    up = next(it)
    assert up.split("#")[0].strip().endswith("&")
    step(shell, up)
    assert probe(shell, "wait_ok", urls=["http://127.0.0.1:8080/health", "http://127.0.0.1:9090/v2/health/live"],
                 timeout=240)["ok"], f"the stack did not come up:\n{shell.tail()}"

    assert "registered sentiment:1" in " ".join(step(shell, next(it)).split())
    add = next(it)
    assert "--wait" in add.split()  # so the next line, the curl, is answered: nothing waits in between
    step(shell, add)

    curl = next(it)
    assert curl.startswith("curl ")
    text = json.loads(shlex.split(curl)[shlex.split(curl).index("-d") + 1])["text"]
    body = json_answer(step(shell, curl))
    assert_same_answer(body, model, tokenizer, text)
    assert body["label"] == "POSITIVE", body  # "great product"

    assert "registered sentiment:2" in " ".join(step(shell, next(it)).split())
    canary_line = next(it)
    assert "--wait" in canary_line.split()
    share = float(re.search(r"--canary (\d+(?:\.\d+)?)%", canary_line).group(1))
    step(shell, canary_line)
    check_canary(shell, home, share, model_v2, tokenizer)

    promote = next(it)
    assert promote.startswith("serving canary promote")
    step(shell, promote)
    (ep,) = [e for e in probe(shell, "endpoints", home=str(home)) if e["name"] == "sentiment"]
    assert [(t["model"], t["version"], t["weight"]) for t in ep["targets"]] == [("sentiment", 2, 100.0)], ep
    assert probe(shell, "until_version", path="/serve/sentiment", text=text, version="2", streak=20,
                 timeout=120)["ok"], f"after promote, answers still come from version 1:\n{shell.tail()}"
    (status, version, answer), = probe(shell, "serve", path="/serve/sentiment", text=text, n=1)
    assert (status, version) == (200, "2")
    assert_same_answer(answer, model_v2, tokenizer, text)
    assert next(it, None) is None, "a Quick start line this test does not check"


def check_canary(shell: Shell, home: Path, share: float, model_v2: Path, tokenizer: Path) -> None:
    """The routes say stable 1 / canary 2 at the given share, and live traffic follows them: of
    N answers, version 2's count is within 4.5 binomial standard deviations of N * share."""
    (ep,) = [e for e in probe(shell, "endpoints", home=str(home)) if e["name"] == "sentiment"]
    routes = sorted((t["version"], t["weight"], t.get("role")) for t in ep["targets"])
    assert routes == [(1, 100 - share, "stable"), (2, share, "canary")], ep
    n, p = 400, share / 100  # right after `--wait`: every worker process serves the new routes
    answers = probe(shell, "serve", path="/serve/sentiment", text="the battery died within an hour", n=n)
    assert all(status == 200 for status, _, _ in answers), [a for a in answers if a[0] != 200][:3]
    v2 = sum(version == "2" for _, version, _ in answers)
    bound = 4.5 * (n * p * (1 - p)) ** 0.5
    assert abs(v2 - n * p) <= bound, f"version 2 served {v2} of {n}, expected {n * p:.0f} +- {bound:.0f}"
    assert {version for _, version, _ in answers} == {"1", "2"}
    (status, version, answer), = probe(shell, "serve", path="/serve/sentiment/2", text="great product", n=1)
    assert (status, version) == (200, "2")
    assert_same_answer(answer, model_v2, tokenizer, "great product")


# --- exporting one's own model ------------------------------------------------------------------

def small_hf_model(folder: Path):
    """A Hugging Face BERT classifier folder as save_pretrained writes it (config.json,
    model.safetensors, tokenizer files): MiniLM's tokenizer, a 2-layer model, random weights."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from serving.testmodels import minilm_dir

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(str(minilm_dir()))
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, num_labels=2)
    model = BertForSequenceClassification(config).eval()
    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return model


@pytest.mark.timeout(600)
def test_the_readme_export_of_ones_own_model_runs_as_written(tmp_path):
    import onnxruntime as ort
    import torch
    from transformers import AutoTokenizer

    from registry.signature import onnx_signature, pytorch_kind

    (block,) = section_blocks(README.read_text(), "Quick start", "python")
    torch_model = small_hf_model(tmp_path / "my-model")
    assert pytorch_kind(tmp_path / "my-model") == "a Hugging Face model folder"  # refused as it is
    (tmp_path / "export.py").write_text(block)
    run = subprocess.run([sys.executable, "export.py"], cwd=tmp_path, capture_output=True, text=True, timeout=500)
    assert run.returncode == 0, run.stderr[-4000:]

    onnx_path, tokenizer_dir = tmp_path / "my-model-onnx" / "model.onnx", tmp_path / "my-model-onnx" / "tokenizer"
    signature = onnx_signature(onnx_path)
    assert [i["name"] for i in signature["inputs"]] == ["input_ids", "attention_mask", "token_type_ids"]
    assert [(o["name"], o["shape"]) for o in signature["outputs"]] == [("logits", [-1, 2])]
    assert pytorch_kind(onnx_path) is None
    # other batch sizes and lengths than the export's sample: the axes are dynamic, the inputs bound by name
    texts = ["a sentence much longer than the sample the model was exported with, to check the axes", "short", "ok"]
    enc = AutoTokenizer.from_pretrained(str(tokenizer_dir))(texts, padding=True, return_tensors="np")
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    got = session.run(None, {i.name: enc[i.name] for i in session.get_inputs()})[0]
    with torch.no_grad():
        expected = torch_model(**{k: torch.tensor(v) for k, v in enc.items()}).logits.numpy()
    assert np.abs(got - expected).max() < 1e-4



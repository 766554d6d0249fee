"""Model names as ClearML allows them (``train sklearn model - sklearn-model``): spaces and any printable
character, through the REST API (URL-encoded), the CLI, listings, `model add --name/--model-id`, the Triton
model repository (a safe directory name; two names that map alike must not collide), an external Triton's
config.pbtxt with ClearML's --aux-config keys, and the statistics labels. Endpoint names stay URL-safe.

Unit checks first; then one stack of real processes on loopback (control plane writing an external
Triton repository, embedded Triton, worker, statistics service).
"""
from __future__ import annotations

import re
import time
from pathlib import Path
from urllib.parse import quote

import httpx
import numpy as np
import onnxruntime as ort
import pytest
from google.protobuf import text_format
from transformers import AutoTokenizer
from tritonclient.grpc import model_config_pb2 as mc

from registry import schemas
from serving.testmodels import build_bert_classifier
from serving.triton.aux_config import AuxConfigError, parse_aux, split_pairs
from serving.triton.naming import triton_base_name, triton_model_name
from serving.triton.repository import DEFAULT_BATCHING, RepositorySync, validate_config_pbtxt
from tests.serving.clearml.commands import COMMANDS, as_typed
from tests.serving.stack import Stack, make_stack

CLEARML_NAME = "train sklearn model - sklearn-model"
TRITON_SAFE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
REGEX_BITS = ("^[", "]{", "{0,", "]*$", "A-Za-z0-9_")  # a refusal must say in words what is allowed


# --- Triton names ------------------------------------------------------------------------------
def test_safe_names_keep_their_form():
    assert triton_model_name("sentiment", 3) == "sentiment_v3"
    assert triton_model_name("clf.v2-final_x", 1) == "clf.v2-final_x_v1"


@pytest.mark.parametrize("names", [
    ["clf a", "clf_a", "clf-a", "clf  a", "clf/a", "clf:a"],  # slugs alike
    ["train sklearn model - sklearn-model", "train_sklearn_model_-_sklearn-model",
     "train sklearn model – sklearn-model", "train sklearn model - sklearn-model."],
    ["é", "è", "模型", "🙂", "?"],  # nothing safe in them: all slug to "model"
])
def test_names_that_map_alike_do_not_collide(names):
    mapped = [triton_base_name(n) for n in names]
    assert len(set(mapped)) == len(names), mapped
    for n, m in zip(names, mapped):
        assert TRITON_SAFE.fullmatch(m) and len(m) <= 128, (n, m)
        assert triton_base_name(n) == m  # stable: the control plane, workers and Triton agree


def test_a_safe_name_shaped_like_a_mapped_one_is_mapped_too():
    """`clf a` maps to `clf_a--<hash>`; a model literally named so must not take that Triton name."""
    mapped = triton_base_name("clf a")
    assert mapped.startswith("clf_a--")
    assert triton_base_name(mapped) != mapped
    assert len({triton_base_name("clf a"), triton_base_name(mapped), triton_base_name("clf_a")}) == 3


def test_model_name_rules_are_said_in_words():
    assert schemas.ModelCreate(name=CLEARML_NAME, artifact="x").name == CLEARML_NAME
    assert schemas.ModelCreate(name="a/b: c (v2) [final] 模型", artifact="x")
    for bad in ["", " lead", "trail ", "tab\there", "line\nbreak", "x" * 129]:
        with pytest.raises(ValueError) as info:
            schemas.ModelCreate(name=bad, artifact="x")
        text = str(info.value)
        assert "printable characters" in text and not any(bit in text for bit in REGEX_BITS), text
    with pytest.raises(ValueError) as info:
        schemas.EndpointDeploy(endpoint="test model", model=CLEARML_NAME)
    text = str(info.value)
    assert "letters, digits, '_', '.' or '-'" in text and not any(bit in text for bit in REGEX_BITS), text


# --- --aux-config --------------------------------------------------------------------------------
_TYPED = as_typed(COMMANDS["huggingface"][2])
HF_AUX = _TYPED[_TYPED.index("--aux-config") + 1:]  # the pairs as the shell hands them over


def test_the_shell_keeps_escaped_quotes_and_drops_plain_ones():
    assert HF_AUX == ['platform="onnxruntime_onnx"', 'default_model_filename="model.bin"',
                      "dynamic_batching.preferred_batch_size=[1,2,4,8,16,32,64]",
                      "dynamic_batching.max_queue_delay_microseconds=5000000", "max_batch_size=64"]


def test_aux_config_as_the_huggingface_command_types_it():
    aux = parse_aux(split_pairs(HF_AUX))
    assert aux.batching == {"preferred_batch_sizes": [1, 2, 4, 8, 16, 32, 64], "max_queue_delay_us": 5000000,
                            "max_batch_size": 64}
    assert aux.ignored == ["platform", "default_model_filename"] and aux.triton == {}
    # the form (quotes left to the shell) and lists quoted inside the value read the same
    same = parse_aux(split_pairs(["platform=onnxruntime_onnx", 'dynamic_batching.preferred_batch_size="[1,2,4]"',
                                  'max_batch_size="64"']))
    assert same.batching == {"preferred_batch_sizes": [1, 2, 4], "max_batch_size": 64}


def test_other_config_pbtxt_keys_are_kept_for_an_external_triton():
    aux = parse_aux(split_pairs(["dynamic_batching.preserve_ordering=true", "instance_group.kind=KIND_CPU",
                                 "response_cache.enable=true", "optimization.input_pinned_memory.enable=false",
                                 'parameters.mode="fast"']))
    assert aux.kept == ["dynamic_batching.preserve_ordering", "instance_group.kind", "response_cache.enable",
                        "optimization.input_pinned_memory.enable", "parameters.mode"]
    assert aux.triton == {"dynamic_batching": {"preserve_ordering": True}, "instance_group": [{"kind": "KIND_CPU"}],
                          "response_cache": {"enable": True}, "optimization": {"input_pinned_memory": {"enable": False}},
                          "parameters": {"mode": {"string_value": "fast"}}}


def test_a_config_pbtxt_file_as_aux_config(tmp_path):
    """ClearML also takes one --aux-config value naming a config.pbtxt file: read the same way."""
    from serving.cli.clearml_flags import aux_pairs

    path = tmp_path / "config.pbtxt"
    path.write_text('name: "x"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 16\n'
                    "dynamic_batching { preferred_batch_size: [4, 8] max_queue_delay_microseconds: 100 "
                    "preserve_ordering: true }\ninstance_group [{ count: 2 kind: KIND_CPU }]\n")
    aux = parse_aux(aux_pairs([str(path)]))
    assert aux.batching == {"max_batch_size": 16, "preferred_batch_sizes": [4, 8], "max_queue_delay_us": 100}
    assert aux.triton == {"instance_group": [{"count": 2, "kind": "KIND_CPU"}], "dynamic_batching": {"preserve_ordering": True}}
    assert aux.ignored == ["name", "platform"]


@pytest.mark.parametrize("pair,words", [
    ("dynamic_batching.preferred_batch_sizes=[1,2]", "'preferred_batch_sizes' is not a field of dynamic_batching"),
    ("max_batch=8", "'max_batch' is not a field of config.pbtxt"),
    ("max_batch_size=many", "max_batch_size: 'many' is not a whole number"),
    ("dynamic_batching.preferred_batch_size=[1,2", "dynamic_batching.preferred_batch_size: '[1,2' is not a list"),
    ("instance_group.kind=GPU", "instance_group.kind: 'GPU' is not one of KIND_AUTO"),
    ("max_batch_size.x=1", "max_batch_size takes a value, it has no field 'x'"),
    ("dynamic_batching=5", "dynamic_batching is a group of settings"),
    ("response_cache.enable=maybe", "response_cache.enable: 'maybe' is not true or false"),
    ("max_batch_size", "must look like key=value"),
])
def test_unknown_or_malformed_keys_are_named(pair, words):
    with pytest.raises(AuxConfigError, match=re.escape(words)):
        parse_aux(split_pairs([pair]))


def test_kept_keys_land_in_the_external_config_pbtxt_under_the_safe_name(tmp_path):
    """Two models whose names slug alike, one endpoint each: two directories, each config.pbtxt naming
    its own directory, with the aux keys merged, and valid against Triton's schema."""
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    for sha in ("a" * 64, "b" * 64):
        (artifacts / sha).write_bytes(b"onnx")
    batching = {**DEFAULT_BATCHING, "max_batch_size": 8, "preferred_batch_sizes": [4],
                "triton_config": {"dynamic_batching": {"preserve_ordering": True}, "instance_group": [{"kind": "KIND_CPU"}],
                                  "parameters": {"mode": {"string_value": "fast"}}}}
    snapshot = {"endpoints": {
        "e1": {"engine": "triton", "batching": batching,
               "targets": [{"model": "clf a", "version": 1, "artifact": "a" * 64, "signature": None,
                            "triton_name": triton_model_name("clf a", 1)}]},
        "e2": {"engine": "triton", "batching": DEFAULT_BATCHING,
               "targets": [{"model": "clf_a", "version": 1, "artifact": "b" * 64, "signature": None,
                            "triton_name": triton_model_name("clf_a", 1)}]}}}
    repo = tmp_path / "repo"
    RepositorySync(repo, lambda sha: artifacts / sha, None).apply(snapshot)
    dirs = sorted(p.name for p in repo.iterdir())
    assert dirs == sorted([triton_model_name("clf a", 1), "clf_a_v1"])
    for d in dirs:
        cfg = validate_config_pbtxt((repo / d / "config.pbtxt").read_text())
        assert cfg.name == d
    cfg = validate_config_pbtxt((repo / triton_model_name("clf a", 1) / "config.pbtxt").read_text())
    assert cfg.dynamic_batching.preserve_ordering and list(cfg.dynamic_batching.preferred_batch_size) == [4]
    assert [(g.count, g.kind) for g in cfg.instance_group] == [(1, mc.ModelInstanceGroup.KIND_CPU)]
    assert cfg.parameters["mode"].string_value == "fast" and cfg.platform == "onnxruntime_onnx"
    assert not validate_config_pbtxt((repo / "clf_a_v1" / "config.pbtxt").read_text()).dynamic_batching.preserve_ordering


# --- over real sockets -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bundles(tmp_path_factory, tiny_model):
    return {"clf a": tiny_model, "clf_a": build_bert_classifier(tmp_path_factory.mktemp("tiny-bert-names"), seed=1)}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = make_stack(tmp_path_factory.mktemp("names-stack"), workers=1)
    s.env["SERVING_TRITON_MODEL_REPOSITORY"] = str(s.home / "external-triton")  # the control plane writes it
    s.env["SERVING_STATISTICS_HOST"] = "127.0.0.1"
    try:
        s.start_components(triton=True)
        yield s
    finally:
        s.stop_all()


def upload(stack: Stack, name: str, path: Path) -> int:
    out = stack.cli("model", "upload", "--name", name, "--project", "serving examples", "--path", str(path)).stdout
    return int(re.search(r"model id (\d+)", out).group(1))


def wait_ready(stack: Stack, endpoint: str, timeout: float = 120.0) -> None:
    revision = stack.api().get("/health").json()["revision"]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if httpx.get(f"{stack.worker_url()}/status", timeout=5).json()["revision"] >= revision and \
                httpx.get(f"{stack.worker_url()}/v2/models/{endpoint}/ready", timeout=5).status_code == 200:
            return
        time.sleep(0.2)
    raise AssertionError(f"{endpoint} not ready: {httpx.get(f'{stack.worker_url()}/status').json()}")


def test_rest_api_takes_names_url_encoded(stack, tiny_model):
    api = stack.api()
    sha = api.post("/artifacts", content=tiny_model.onnx_path.read_bytes()).json()["sha256"]
    weird = "team/a: clf (v2) [final] 100% é"
    for name in (CLEARML_NAME, weird):
        r = api.post("/models", json={"name": name, "artifact": sha})
        assert r.status_code == 201 and r.json()["name"] == name, r.text
    listed = api.get(f"/models?name={quote(weird, safe='')}").json()
    assert [m["name"] for m in listed] == [weird]
    removed = api.delete(f"/models/{quote(weird, safe='')}")  # '/' as %2F, ' ' as %20, '%' as %25
    assert removed.status_code == 200 and removed.json() == {"removed": 1}, removed.text
    assert api.get("/models", params={"name": weird}).json() == []
    for bad in ("tab\tname", " leading"):
        r = api.post("/models", json={"name": bad, "artifact": sha})
        assert r.status_code == 422 and "printable characters" in r.text, r.text
        assert not any(bit in r.json()["detail"][0]["msg"] for bit in REGEX_BITS), r.text
    r = api.post("/endpoints", json={"endpoint": "my endpoint", "model": CLEARML_NAME})
    assert r.status_code == 422 and "letters, digits" in r.text and "/serve/NAME" in r.text, r.text
    r = api.post("/endpoints", json={"endpoint": "e", "model": CLEARML_NAME,
                                     "aux_config": {"dynamic_batching.preferred_batch_sizes": "[1]"}})
    assert r.status_code == 422 and "preferred_batch_sizes" in r.text, r.text


def test_cli_names_with_spaces_and_triton_collision(stack, bundles):
    """`clf a` and `clf_a` slug alike: each endpoint answers with its own model's logits through the
    embedded Triton; the external repository holds both, with the kept --aux-config key."""
    ids = {name: upload(stack, name, b.onnx_path) for name, b in bundles.items()}
    listed = stack.cli("model", "list", "--json").stdout
    assert '"clf a"' in listed and '"clf_a"' in listed
    tok = str(bundles["clf a"].tokenizer_dir)
    out = stack.cli("model", "add", "--engine", "triton", "--endpoint", "names_space", "--name", "clf a",
                    "--tokenizer", tok, "--aux-config", "dynamic_batching.preserve_ordering=true").stdout
    assert "kept for an external Triton's config.pbtxt" in " ".join(out.split()), out
    stack.cli("model", "add", "--engine", "triton", "--endpoint", "names_underscore", "--model-id", str(ids["clf_a"]),
              "--tokenizer", tok)
    assert stack.api().get("/endpoints/names_underscore").json()["targets"][0]["model"] == "clf_a"
    texts = ["a calm and bright day", "rude late broken"]
    for endpoint, name in (("names_space", "clf a"), ("names_underscore", "clf_a")):
        wait_ready(stack, endpoint)
        b = bundles[name]
        tokenizer = AutoTokenizer.from_pretrained(str(b.tokenizer_dir))
        sess = ort.InferenceSession(str(b.onnx_path), providers=["CPUExecutionProvider"])
        for text in texts:
            enc = tokenizer([text], truncation=True, max_length=128, return_tensors="np")
            want = sess.run(["logits"], {i.name: enc[i.name].astype(np.int64) for i in sess.get_inputs()})[0][0]
            r = httpx.post(f"{stack.worker_url()}/serve/{endpoint}", json={"text": text}, timeout=30)
            assert r.status_code == 200 and r.headers["X-Model-Version"] == "1", r.text
            np.testing.assert_allclose(r.json()["logits"], want, atol=1e-4)
    repo = Path(stack.env["SERVING_TRITON_MODEL_REPOSITORY"])
    spaced = repo / triton_model_name("clf a", 1) / "config.pbtxt"
    deadline = time.monotonic() + 30
    while not spaced.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    cfg = mc.ModelConfig()
    text_format.Parse(spaced.read_text(), cfg)
    assert cfg.name == triton_model_name("clf a", 1) and cfg.dynamic_batching.preserve_ordering
    assert (repo / "clf_a_v1" / "config.pbtxt").exists()


def test_statistics_count_requests_of_a_model_named_with_spaces(stack, bundles):
    """Requests are labelled by endpoint and version (a model name is never a label): the version the
    model with spaces serves is counted under its endpoint."""
    stack.cli("model", "add", "--engine", "onnxruntime", "--endpoint", "names_stats", "--name", "clf a",
              "--tokenizer", str(bundles["clf a"].tokenizer_dir))
    wait_ready(stack, "names_stats")
    for _ in range(5):
        assert httpx.post(f"{stack.worker_url()}/serve/names_stats", json={"text": "fine"}, timeout=30).status_code == 200
    url = f"http://127.0.0.1:{stack.env['SERVING_STATISTICS_PORT']}/metrics"
    series = 'serving_requests_total{endpoint="names_stats",status="200",version="1"}'
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        lines = [ln for ln in httpx.get(url, timeout=5).text.splitlines() if ln.startswith("serving_requests_total{")]
        counted = [float(ln.rsplit(" ", 1)[1]) for ln in lines if _labels(ln) == _labels(series + " 0")]
        if counted and counted[0] >= 5:
            assert counted[0] == 5
            return
        time.sleep(0.3)
    raise AssertionError(f"no count for names_stats: {lines}")


def _labels(line: str) -> dict[str, str]:
    return dict(re.findall(r'(\w+)="([^"]*)"', line.split("}", 1)[0]))

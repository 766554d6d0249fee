"""`serving model ...`: upload, list, remove model versions and put them behind endpoints."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Optional
from urllib.parse import quote

import typer

from serving.cli.clearml_flags import aux_notes, aux_pairs, endpoint_of, framework_for, io_declaration, parse_sizes
from serving.cli.client import ControlPlane
from serving.cli.encoder_folder import encoder_options, exported_folder
from serving.cli.hf_folder import is_llm_folder, upload_folder
from serving.llm.adapters.peft import is_adapter_folder
from serving.llm.naming import LLM_ENGINES
from serving.torchserve.archive import is_archive
from serving.cli.output import console, show
from serving.cli.readiness import after_deploy
from serving.cli.pytorch_upload import PytorchOptions, upload_pytorch
from serving.cli.triton_upload import triton_onnx_file, triton_upload, upload_triton

# Triton's batcher only groups requests of one shape: a few length buckets let different lengths share a batch.
BATCH_PAD_MULTIPLE = 16

app = typer.Typer(help="Model versions in the registry, and deploying them to endpoints.", no_args_is_help=True)


def plane(ctx: typer.Context) -> ControlPlane:
    return ctx.obj


@app.command()
def upload(
    ctx: typer.Context,
    name: str = typer.Option(..., "--name", help="model name; each upload adds the next version"),
    path: Path = typer.Option(..., "--path", exists=True, help="model file (ONNX, joblib, xgboost, ...), a Triton "
                                                               "model folder / file (docs/serving.md), or a Hugging "
                                                               "Face causal LM folder (engine vllm)"),
    framework: Optional[str] = typer.Option(None, help="onnx | sklearn (scikit-learn) | xgboost | lightgbm | pytorch | "
                                                      "tensorflow | custom, a Triton format: tensorrt | torchscript "
                                                      "| savedmodel | openvino | python, or hf-causal-lm (default: "
                                                      "from the file or folder)"),
    project: Optional[str] = typer.Option(None, hidden=True, help="ClearML Serving's; models are not grouped here"),
    tag: list[str] = typer.Option([], "--tag", "--tags", help="repeatable"),
    metadata: Optional[str] = typer.Option(None, help="JSON object stored with the version"),
    optimize: Optional[str] = typer.Option(None, help="fusion | int8 | fp16: onnxruntime transformer fusions, "
                                                      "+ int8 weights (CPU), or + fp16 (GPU)"),
    num_heads: int = typer.Option(0, help="attention heads, for --optimize (0: detect)"),
    hidden_size: int = typer.Option(0, help="hidden size, for --optimize (0: detect)"),
    base: Optional[str] = typer.Option(None, "--base", help="a PEFT LoRA adapter folder's base version, NAME:VERSION "
                                                            "(or its model id): served in that version's engines"),
    model_file: Optional[Path] = typer.Option(None, "--model-file", exists=True, dir_okay=False,
                                              help="PyTorch state dict (--path): the Python file defining its "
                                                   "nn.Module class (docs/torchserve.md#plain-pytorch-files)"),
    model_class: Optional[str] = typer.Option(None, help="--model-file's class, when it defines several"),
    runtime: Optional[str] = typer.Option(None, help="PyTorch files: auto (default: ONNX where the export agrees "
                                                     "with torch, else torch) | onnx | torch"),
    input_name: list[str] = typer.Option([], help="PyTorch files: input names (default: forward()'s parameters)"),
    input_type: list[str] = typer.Option([], help="PyTorch files: numpy dtype per input (default float32)"),
    input_size: list[str] = typer.Option([], help="PyTorch files: one example's dims per input, without the batch "
                                                  "dimension (-1: any size): 3 32 32, or \"[-1]\" per input"),
    output_name: list[str] = typer.Option([], help="PyTorch files: output names (default: output__0, ...)"),
) -> None:
    """Upload a model file or folder (with a progress bar) and register it as a new version.

    A Triton model goes as users have it: its model folder (config.pbtxt and a version directory), or
    one model file or folder whose format is read from it (model.plan, model.pt, model.savedmodel/,
    model.xml with its .bin, model.py). A Hugging Face causal LM folder goes as one version (engine vllm);
    a PEFT LoRA adapter folder (adapter_config.json) as one version that knows its --base. A
    sentence-transformers folder (an embedding model or a cross-encoder) is exported to ONNX first. A
    PyTorch file (TorchScript, a .pt2, a state dict with --model-file) is exported to ONNX where onnxruntime
    agrees with torch, else served with torch in the worker (--runtime forces either)."""
    if is_adapter_folder(path) or base is not None:
        _upload_adapter(plane(ctx), name, path, base, tag)
        return
    if path.is_file() and is_archive(path):  # a TorchServe archive goes as it is: its handler serves it
        _upload_archive(plane(ctx), name, path, tag)
        return
    torch_options = PytorchOptions(model_file, model_class, runtime, input_name, input_type, input_size, output_name,
                                   optimize)
    if upload_pytorch(plane(ctx), name, path, framework, tag, metadata, torch_options):  # TorchScript, .pt2, state dict
        return
    exported = exported_folder(path, framework)
    if exported is not None:
        _remove_when_done(ctx, exported.parent)
        path, framework = exported, "onnx"
    llm = is_llm_folder(path, framework)
    triton = None if llm else triton_upload(path, framework)
    if triton is not None and triton.name == "onnx":  # the platform writes ONNX models' config.pbtxt itself
        path, framework = triton_onnx_file(path), "onnx"
        triton = None
    if not llm and triton is None:
        _refuse_unservable(path, framework)
    cp = plane(ctx)
    try:
        meta = json.loads(metadata) if metadata else {}
    except ValueError as exc:
        raise typer.BadParameter(f"--metadata is not valid JSON: {exc}")
    if optimize:
        if llm:
            raise typer.BadParameter("--optimize is for ONNX models; vLLM runs the folder as it is")
        path, report = _optimized(path, optimize, num_heads, hidden_size)
        _remove_when_done(ctx, path.parent)
        meta.update(report)
    if llm:
        sha, framework = upload_folder(cp, path), "hf-causal-lm"
    elif triton is not None:
        sha, framework = upload_triton(cp, path, triton), triton.name
    else:
        sha, framework = cp.upload_file(path), framework_for(path, framework)
    m = cp.post("/models", json={"name": name, "artifact": sha, "framework": framework,
                                 "tags": tag, "metadata": meta})
    console.print(f"registered [bold]{m['name']}:{m['version']}[/bold] (model id {m.get('id')}, {m['size']} bytes, "
                  f"sha256 {m['sha256'][:12]})")
    for skip in m.get("not_followed") or ():  # an auto-update endpoint whose engine cannot run it
        console.print(f"note: endpoint {skip['endpoint']} does not follow this version: {skip['reason']}")


def _upload_archive(cp: ControlPlane, name: str, path: Path, tags: list[str]) -> None:
    m = cp.post("/models", json={"name": name, "artifact": cp.upload_file(path), "framework": "torchserve",
                                 "tags": tags})
    info = (m.get("signature") or {}).get("torchserve") or {}
    config = info.get("config") or {}
    console.print(f"registered [bold]{m['name']}:{m['version']}[/bold] (model id {m.get('id')}), a TorchServe archive: "
                  f"handler {info.get('handler')}, batch size {config.get('batchSize', 1)}, max batch delay "
                  f"{config.get('maxBatchDelay', 100)} ms; serve it with `serving model add --endpoint {m['name']} "
                  f"--model {m['name']}`")


def _upload_adapter(cp: ControlPlane, name: str, path: Path, base: Optional[str], tags: list[str]) -> None:
    """A LoRA adapter folder: one artifact, registered with its base (the registry checks it fits)."""
    if not is_adapter_folder(path):
        raise typer.BadParameter(f"--base is for a PEFT LoRA adapter folder; {path} has no adapter_config.json",
                                 param_hint="--path")
    if not base:
        raise typer.BadParameter(f"{path} is a LoRA adapter: give the version it was trained on with --base "
                                 "NAME:VERSION", param_hint="--base")
    sha = upload_folder(cp, path)
    m = cp.post("/models", json={"name": name, "artifact": sha, "framework": "hf-lora", "tags": tags,
                                 "base": model_by_id(cp, base)})
    lora = (m.get("signature") or {}).get("lora") or {}
    console.print(f"registered [bold]{m['name']}:{m['version']}[/bold] (model id {m.get('id')}), a LoRA adapter "
                  f"of {base} (rank {lora.get('rank')} on {', '.join(lora.get('target_modules') or [])})")


def _refuse_unservable(path: Path, framework: Optional[str]) -> None:
    """Before uploading: PyTorch/safetensors files and model folders get the ONNX export instructions
    (the control plane refuses them too), unless --framework custom says user code loads the file."""
    from registry.signature import SignatureError, refuse_pytorch

    custom = framework is not None and framework_for(path, framework) == "custom"
    try:
        refuse_pytorch(path, "custom" if custom else "onnx", str(path))
    except SignatureError as exc:
        raise typer.BadParameter(str(exc), param_hint="--path")
    if path.is_dir():
        raise typer.BadParameter(f"{path} is a folder; give the model file", param_hint="--path")


def _remove_when_done(ctx: typer.Context, folder: Path) -> None:
    """A folder this command wrote (an export, an optimized copy) goes once it has uploaded it, or failed:
    left behind, every upload of an 87 MB encoder kept a copy in the temp folder."""
    ctx.call_on_close(lambda: shutil.rmtree(folder, ignore_errors=True))


def _optimized(path: Path, mode: str, num_heads: int, hidden_size: int) -> tuple[Path, dict]:
    from serving.optimize import optimize

    from serving.optimize import MODES

    if mode not in MODES:
        raise typer.BadParameter(f"--optimize must be one of {', '.join(MODES)}, not {mode!r}")
    with console.status(f"optimizing ({mode}) and checking agreement on a sample"):
        report = optimize(path, mode, num_heads=num_heads, hidden_size=hidden_size)
    console.print(f"{mode}: predicted label agrees with the original on {report.label_agreement:.1%} of "
                  f"{report.samples} samples (max |logit diff| {report.max_abs_logit_diff:.2e}); "
                  f"{report.size_before / 1e6:.1f} MB -> {report.size_after / 1e6:.1f} MB")
    return report.path, report.as_metadata()


@app.command("list")
def list_(ctx: typer.Context, name: Optional[str] = typer.Option(None), json_: bool = typer.Option(False, "--json")) -> None:
    """List model versions."""
    rows = plane(ctx).get("/models", params={"name": name} if name else None)
    show(rows, ["name", "version", "framework", "size", "sha256", "tags", "created_at"], json_, "models")


@app.command()
def remove(ctx: typer.Context, name: str = typer.Option(..., "--name"), version: Optional[int] = typer.Option(None)) -> None:
    """Remove a model version (or all versions); refused while an endpoint routes to it."""
    out = plane(ctx).request("DELETE", f"/models/{quote(name, safe='')}", params={"version": version} if version else None)
    console.print(f"removed {out['removed']} version(s) of {name}")


def parse_model_ref(ref: str) -> tuple[str, int | None]:
    """``NAME`` or ``NAME:VERSION``; names may hold spaces and colons, so only a trailing ``:digits`` is a version."""
    name, sep, version = ref.rpartition(":")
    if sep and name and version.isdigit():
        return name, int(version)
    return ref, None


def model_by_id(cp: ControlPlane, model_id: str) -> str:
    """ClearML's ``--model-id``: the id `model upload` printed (NAME[:VERSION] works too) -> NAME:VERSION."""
    if not model_id.strip().isdigit():
        return model_id
    found = [m for m in cp.get("/models") if str(m.get("id")) == model_id.strip()]
    if not found:
        raise typer.BadParameter(f"no model has id {model_id} (`serving model list` shows the ids)",
                                 param_hint="--model-id")
    return f"{found[0]['name']}:{found[0]['version']}"


def parse_percent(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text.rstrip("%"))
    except ValueError:
        raise typer.BadParameter(f"canary share '{text}' must look like 10%")
    if not 0 < value < 100:
        raise typer.BadParameter("canary share must be between 0% and 100%")
    return value


_ENGINES = ("triton | onnxruntime | sklearn | xgboost | lightgbm | custom | custom_async | vllm | torchserve | "
            "torch (default: what the model's format implies, a TorchServe archive torchserve; else triton)")


@app.command()
def add(
    ctx: typer.Context,
    endpoint: str = typer.Option(..., "--endpoint", help="public endpoint name (/serve/ENDPOINT)"),
    model: Optional[str] = typer.Option(None, "--model", "--name",
                                        help="NAME or NAME:VERSION (latest when omitted); none for a custom endpoint"),
    model_id: Optional[str] = typer.Option(None, "--model-id", help="the model id `model upload` printed"),
    engine: Optional[str] = typer.Option(None, help=_ENGINES),
    tokenizer: Optional[Path] = typer.Option(None, file_okay=False, exists=True, help="Hugging Face tokenizer dir"),
    preprocess: Optional[Path] = typer.Option(None, dir_okay=False, exists=True, help="preprocess.py (ClearML interface)"),
    labels: Optional[str] = typer.Option(None, help="comma-separated class labels for the tokenizer postprocess"),
    max_length: Optional[int] = typer.Option(None, help="tokenizer truncation length (default 128; an encoder: "
                                                        "its folder's, else 512)"),
    task: Optional[str] = typer.Option(None, help="embed | rerank: an encoder endpoint (default: from a "
                                                  "sentence-transformers --tokenizer folder; docs/embeddings.md)"),
    pooling: Optional[str] = typer.Option(None, help="embeddings: mean | cls | max | last | mean_sqrt_len | "
                                                     "weighted_mean (default: the folder's 1_Pooling, else mean)"),
    normalize: Optional[bool] = typer.Option(None, "--normalize/--no-normalize",
                                             help="embeddings: unit length (default: the folder's 2_Normalize)"),
    max_batch_tokens: Optional[int] = typer.Option(None, min=1, help="encoders: padded tokens of one engine call "
                                                                     "(default 16384)"),
    pad_to_multiple_of: Optional[int] = typer.Option(
        None, help="round padded lengths up to a multiple, so Triton can batch requests of different lengths "
                   "(default: 16 behind Triton's dynamic batcher, else 0: the longest text)"),
    canary: Optional[str] = typer.Option(None, help="e.g. 10%: this version takes that share, the current one the rest"),
    shadow: Optional[str] = typer.Option(None, help="e.g. 100%: a copy of that share of requests goes to this version, "
                                                    "compared with the live answer, never returned (docs/rollouts.md)"),
    max_batch_size: Optional[int] = typer.Option(None, help="Triton batching (default 32; 0 when tensors are declared)"),
    max_queue_delay_us: Optional[int] = typer.Option(None, help="Triton dynamic batcher queue delay (default 2000)"),
    preferred_batch_size: list[int] = typer.Option([], help="repeatable"),
    instances: Optional[int] = typer.Option(None, help="Triton model instances (default 1)"),
    input_name: list[str] = typer.Option([], help="declared inputs, in the order preprocess returns them"),
    input_type: list[str] = typer.Option([], help="numpy dtype per input (float32, int64, ...)"),
    input_size: list[str] = typer.Option([], help="Triton dims per input: 1 28 28, or \"[-1, -1]\" per input"),
    output_name: list[str] = typer.Option([], help="declared outputs, in the order postprocess gets them"),
    output_type: list[str] = typer.Option([], help="numpy dtype per output"),
    output_size: list[str] = typer.Option([], help="dims per output"),
    aux_config: list[str] = typer.Option([], help="ClearML's config.pbtxt key=value: max_batch_size, "
                                                   "dynamic_batching.*, any other config.pbtxt field; engine "
                                                   "vllm: its options, e.g. max_model_len=512 (docs/llm-engine.md)"),
    requirements: list[str] = typer.Option([], "--requirements", "--packages",
                                           help="pip requirements preprocess.py imports, installed by the workers"),
    tags: list[str] = typer.Option([], "--tags", help="pick the newest version of --model with these tags"),
    project: Optional[str] = typer.Option(None, hidden=True, help="ClearML Serving's; models are not grouped here"),
    published: bool = typer.Option(False, "--published", hidden=True, help="ClearML Serving's; every version counts"),
    max_versions: Optional[int] = typer.Option(None, "--max-versions", min=1, max=100,
                                               help="auto-update: serve the newest N versions as they are uploaded"),
    wait: bool = typer.Option(False, "--wait", help="return once the new routes answer on every worker process "
                                                    "(exit 1 if the version fails to load)"),
    wait_timeout: float = typer.Option(300.0, "--wait-timeout", min=1.0, help="seconds --wait waits at most"),
) -> None:
    """Deploy a model version behind an endpoint, or as a canary of it (ClearML's flags work too).

    As `model auto-update`, the endpoint follows the newest --max-versions (default 1) versions."""
    if ctx.info_name == "auto-update":
        max_versions = max_versions or 1
    if model_id:
        model = model_by_id(plane(ctx), model_id)
    if shadow is not None:
        ep = plane(ctx).post("/endpoints", json=shadow_body(endpoint, model, shadow))
        console.print(f"endpoint [bold]{ep['name']}[/bold]: " + ", ".join(
            f"{t['model']}:{t['version']} {t['weight']:g}% ({t['role']})" for t in ep["targets"]))
        after_deploy(plane(ctx), ep["name"], wait, wait_timeout)
        return
    encoder = None
    if tokenizer is not None:
        encoder = encoder_options(tokenizer, task, pooling, normalize, max_length, max_batch_tokens)
    elif task or pooling or normalize is not None or max_batch_tokens:
        raise typer.BadParameter("--task, --pooling, --normalize and --max-batch-tokens need --tokenizer")
    body = _deploy_body(ctx, endpoint, model, engine, tokenizer, preprocess, labels, max_length or 128,
                        pad_to_multiple_of, canary, max_batch_size, max_queue_delay_us, preferred_batch_size, instances,
                        (input_name, input_type, input_size, output_name, output_type, output_size),
                        aux_config, requirements, tags, max_versions, encoder)
    ep = plane(ctx).post("/endpoints", json=body)
    routes = ", ".join(f"{t['model']}:{t['version']} {t['weight']:g}%" for t in ep["targets"]) or "no model"
    follow = f" (following the newest {max_versions} versions)" if max_versions else ""
    notes = [] if ep["engine"] in LLM_ENGINES else aux_notes(body.get("aux_config"), (ep.get("batching") or {}).get("triton_config"))
    for note in notes:
        console.print(f"note: {note}")
    for skip in (ep.get("auto_update") or {}).get("skipped") or ():
        console.print(f"note: skipped version {skip['version']}: {skip['reason']}")
    console.print(f"endpoint [bold]{ep['name']}[/bold] ({ep['engine']}): {routes}{follow}")
    after_deploy(plane(ctx), ep["name"], wait, wait_timeout)


app.command("auto-update")(add)


def _deploy_body(ctx: typer.Context, endpoint: str, model: Optional[str], engine: Optional[str], tokenizer: Optional[Path],
                 preprocess: Optional[Path], labels: Optional[str], max_length: int, pad_to_multiple_of: Optional[int],
                 canary: Optional[str], max_batch_size: Optional[int], max_queue_delay_us: Optional[int],
                 preferred_batch_size: list[int], instances: Optional[int], io_flags: tuple, aux_config: list[str],
                 requirements: list[str], tags: list[str], max_versions: Optional[int],
                 encoder: dict[str, Any] | None = None) -> dict[str, Any]:
    if tokenizer and preprocess:
        raise typer.BadParameter("give --tokenizer or --preprocess, not both")
    if requirements and not preprocess:
        raise typer.BadParameter("--requirements are installed for preprocess.py: give --preprocess")
    cp = plane(ctx)
    name, version = parse_model_ref(model) if model else (None, None)
    if name and tags and version is None:
        version = _newest_tagged(cp, name, tags)
    io = _io(io_flags)
    batching: dict[str, Any] = {}
    for key, value in (("max_batch_size", max_batch_size), ("max_queue_delay_us", max_queue_delay_us),
                       ("instances", instances), ("preferred_batch_sizes", preferred_batch_size or None)):
        if value is not None:
            batching[key] = value
    body: dict[str, Any] = {"endpoint": endpoint, "model": name, "version": version, "engine": engine,
                            "canary": parse_percent(canary), "batching": batching or None, "io": io,
                            "max_versions": max_versions, "aux_config": aux_pairs(aux_config)}
    if tokenizer and encoder is not None:  # embeddings or rerank: the token batcher pads, no length buckets
        body["preprocess"] = {"kind": "tokenizer", "artifact": cp.upload_dir(tokenizer), "options": encoder}
    elif tokenizer:
        labels = labels if labels is not None else _kept_labels(cp, endpoint)
        body["preprocess"] = _tokenizer_spec(cp, tokenizer, labels, max_length, pad_to_multiple_of, engine,
                                             batching.get("max_batch_size", 32))
    elif preprocess:
        body["preprocess"] = {"kind": "user", "artifact": cp.upload_file(preprocess),
                              "options": {"requirements": requirements} if requirements else {}}
    return body


def _kept_labels(cp: ControlPlane, endpoint: str) -> Optional[str]:
    """A deploy onto an existing endpoint without --labels keeps the endpoint's labels. The tokenizer's
    postprocess belongs to the endpoint, shared by all its versions: a canary added without --labels
    would otherwise rename the stable version's answers too (LABEL_0, LABEL_1)."""
    for ep in cp.get("/endpoints"):
        kept = ((ep.get("preprocess") or {}).get("options") or {}).get("labels") if ep["name"] == endpoint else None
        if kept:
            console.print(f"note: keeping the endpoint's labels {','.join(kept)} (--labels changes them)")
            return ",".join(kept)
    return None


def shadow_body(endpoint: str, model: Optional[str], percent: str) -> dict[str, Any]:
    """A shadow runs with the endpoint's engine and preprocessing: only the version and its share are sent."""
    if not model:
        raise typer.BadParameter("a shadow needs --model NAME[:VERSION]")
    try:
        value = float(percent.rstrip("%"))
    except ValueError:
        raise typer.BadParameter(f"shadow share '{percent}' must look like 100% or 30%")
    if not 0 < value <= 100:
        raise typer.BadParameter("shadow share must be above 0% and at most 100%")
    name, version = parse_model_ref(model)
    return {"endpoint": endpoint, "model": name, "version": version, "shadow": value}


def _io(flags: tuple) -> dict[str, Any] | None:
    in_names, in_types, in_sizes, out_names, out_types, out_sizes = flags
    inputs = io_declaration(in_names, in_types, parse_sizes(in_sizes, "--input-size"), "input")
    outputs = io_declaration(out_names, out_types, parse_sizes(out_sizes, "--output-size"), "output")
    return {"inputs": inputs, "outputs": outputs} if inputs or outputs else None


def _tokenizer_spec(cp: ControlPlane, tokenizer: Path, labels: Optional[str], max_length: int,
                    pad_to_multiple_of: Optional[int], engine: Optional[str], max_batch_size: int) -> dict[str, Any]:
    if pad_to_multiple_of is None:  # padding only pays where requests are batched together
        pad_to_multiple_of = BATCH_PAD_MULTIPLE if engine in (None, "triton") and max_batch_size > 0 else 0
    if pad_to_multiple_of and max_length % pad_to_multiple_of:
        raise typer.BadParameter(f"--max-length {max_length} must be a multiple of --pad-to-multiple-of")
    options = {"max_length": max_length, "pad_to_multiple_of": pad_to_multiple_of,
               **({"labels": labels.split(",")} if labels else {})}
    return {"kind": "tokenizer", "artifact": cp.upload_dir(tokenizer), "options": options}


def _newest_tagged(cp: ControlPlane, name: str, tags: list[str]) -> int:
    tagged = [m for m in cp.get("/models", params={"name": name}) if set(tags) <= set(m["tags"])]
    if not tagged:
        raise typer.BadParameter(f"no version of {name} has tags {tags}")
    return max(m["version"] for m in tagged)


@app.command()
def canary(
    ctx: typer.Context,
    endpoint: str = typer.Option(..., "--endpoint"),
    weights: list[float] = typer.Option(..., "--weights", help="e.g. 0.1 0.9: one per version, oldest first"),
    input_endpoints: list[str] = typer.Option([], "--input-endpoints", help="versions as ENDPOINT/VERSION"),
    input_endpoint_prefix: Optional[str] = typer.Option(None, "--input-endpoint-prefix",
                                                        help="the newest versions of this endpoint"),
) -> None:
    """Split traffic between an endpoint's versions (ClearML's ``model canary``)."""
    cp = plane(ctx)
    if bool(input_endpoints) == bool(input_endpoint_prefix):
        raise typer.BadParameter("give --input-endpoints or --input-endpoint-prefix")
    refs = [endpoint_of(e) for e in input_endpoints] or [endpoint_of(input_endpoint_prefix)]
    other = sorted({n for n, _ in refs if n != endpoint})
    if other:
        raise typer.BadParameter(f"a canary splits one endpoint's versions: {other} are other endpoints "
                                 f"(deploy their models as versions of {endpoint})")
    if input_endpoint_prefix:
        ep = cp.request("PUT", f"/endpoints/{endpoint}/newest-weights", json={"weights": weights})
    else:
        if len(weights) != len(refs) or any(v is None for _, v in refs):
            raise typer.BadParameter("--input-endpoints need ENDPOINT/VERSION each, one per --weights value")
        total = sum(weights) or 1.0
        split = {str(v): 100.0 * w / total for (_, v), w in zip(refs, weights)}
        ep = cp.request("PUT", f"/endpoints/{endpoint}/weights", json={"weights": split})
    routes = ", ".join(f"{t['model']}:{t['version']}={t['weight']:g}%" for t in ep["targets"])
    console.print(f"endpoint [bold]{ep['name']}[/bold]: {routes}")

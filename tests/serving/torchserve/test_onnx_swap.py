"""Engine option ``runtime``: onnxruntime in place of a TorchServe handler's model (serving/torchserve/onnx_swap.py).

Two levels. In this process, the proxy around small models: several inputs, nested tuple/dict outputs,
and each reason the swap does not apply (the model keeps answering through torch). Through real
handler processes (HandlerPool, as the worker runs them), the archives of tests/serving/torchserve/
archives.py: the same batches sent to a ``runtime torch`` and a ``runtime onnx`` pool answer the same
JSON (numbers within 1e-5), and the onnx pool's timings say onnxruntime ran them; an archive whose
export fails, or whose output follows the batch size, answers through torch with the reason reported.
"""
from __future__ import annotations

import asyncio
import json
import subprocess
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Sequence

import pytest
import torch

from serving.torchserve.archive import read_archive, unpack
from serving.torchserve.codec import HandlerAnswer, HandlerRequest, Parameter
from serving.torchserve.handler_pool import HandlerPool, PoolSpec
from serving.torchserve.onnx_swap import OnnxProxy, SwapState, install
from serving.torchserve.options import OptionError, check_options, effective
from tests.serving.torchserve.archives import Archive, archiver_command, build_archives

TOLERANCE = 1e-5  # the issue's: answers equal to TorchServe's within 1e-5

# ------------------------------------------------------------------------------------------- options


def test_runtime_option_is_checked_and_defaults_to_torch() -> None:
    assert check_options({"runtime": " ONNX ", "batch_size": "4"}) == {"runtime": "onnx", "batch_size": 4}
    assert check_options({"runtime": "auto"}) == {"runtime": "auto"}
    with pytest.raises(OptionError, match="runtime must be one of torch, onnx, auto"):
        check_options({"runtime": "tensorrt"})
    with pytest.raises(OptionError, match="the options are .*threads, runtime"):
        check_options({"runtimes": "onnx"})
    info = SimpleNamespace(batch_size=1, max_batch_delay_ms=100, response_timeout_s=120, config={})
    assert effective(info, {})["runtime"] == "torch"
    assert effective(info, {"runtime": "auto"})["runtime"] == "auto"


def test_the_engine_passes_the_runtime_to_its_handler_processes(archives: dict[str, Archive], tmp_path: Path) -> None:
    from serving.worker.engines.torchserve import TorchServeEngine
    from serving.worker.runtime import Target

    engine = TorchServeEngine(lambda artifact: archives["subclass"].mar, tmp_path)
    target = Target("subclass", 1, 100.0, "", "a" * 64, (), (), engine_options={"runtime": "auto"})
    assert engine._spec(target).runtime == "auto"
    assert engine._spec(Target("subclass", 1, 100.0, "", "a" * 64, (), ())).runtime == "torch"


# ------------------------------------------------------------------------------ the proxy, in-process


class _Handler:
    """A class handler as TorchServe's loader leaves it: the entry point is its bound ``handle``."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def handle(self, data: Any, context: Any) -> Any:
        return data


def _installed(model: torch.nn.Module, runtime: str = "auto") -> tuple[_Handler, SwapState | None]:
    handler = _Handler(model.eval())
    return handler, install(SimpleNamespace(_entry_point=handler.handle), runtime, 1)


def _call(model: Any, *args: Any, **kwargs: Any) -> Any:
    with torch.inference_mode():  # as BaseHandler.inference calls it
        return model(*args, **kwargs)


def _max_diff(a: Any, b: Any) -> float:
    """The largest difference between two outputs (tensors or JSON), asserting the same structure."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype
        return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0
    if isinstance(a, dict):
        assert isinstance(b, dict) and type(a) is type(b) and set(a) == set(b), (a, b)
        return max((_max_diff(a[k], b[k]) for k in a), default=0.0)
    if isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), (a, b)
        return max((_max_diff(x, y) for x, y in zip(a, b)), default=0.0)
    if isinstance(a, float) or isinstance(b, float):
        return abs(float(a) - float(b))
    assert a == b, (a, b)
    return 0.0


class TwoInputs(torch.nn.Module):
    """Several tensors in (one of them int64), a dict holding a tuple out."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)
        self.embedding = torch.nn.Embedding(10, 3)

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> dict[str, Any]:
        hidden = self.linear(x) + self.embedding(ids)
        return {"logits": hidden, "parts": (hidden.softmax(-1), ids * 2)}


def test_several_inputs_and_nested_outputs_run_on_onnxruntime() -> None:
    torch.manual_seed(0)
    model = TwoInputs()
    handler, state = _installed(model)
    assert isinstance(handler.model, OnnxProxy) and state is not None and state.pending
    x, ids = torch.randn(3, 4), torch.tensor([1, 5, 9])
    first = _call(handler.model, x, ids)
    report = state.take()
    assert report["runtime"] == "onnx" and report["used"] == ["torch"], report  # torch answered the first batch
    assert "batch sizes 3, 1" in report["reason"] and report["agreement"]["atol"] == TOLERANCE
    assert _max_diff(first, _call(model, x, ids)) == 0.0
    for batch in (3, 1, 7):  # other batch sizes than the one exported with
        x, ids = torch.randn(batch, 4), torch.randint(0, 10, (batch,))
        swapped = _call(handler.model, x, ids)
        assert state.take()["used"] == ["onnx"]
        assert isinstance(swapped, dict) and isinstance(swapped["parts"], tuple)
        assert swapped["parts"][1].dtype == torch.int64
        assert _max_diff(swapped, _call(model, x, ids)) <= TOLERANCE
    assert handler.model.linear is model.linear  # the handler still reaches its model's attributes


@pytest.mark.filterwarnings("ignore:.*torch.jit.script.*:DeprecationWarning")  # TorchServe 0.12 archives hold them
def test_scripted_model_returning_a_dict_is_traced_and_swapped() -> None:
    """TorchServe's segmenters return {"out": ...}; a scripted graph with a dict is refused by the exporter."""
    class Segmenter(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.head = torch.nn.Conv2d(3, 4, kernel_size=4, stride=4)

        def forward(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"out": self.head(images)}

    torch.manual_seed(1)
    scripted = torch.jit.script(Segmenter().eval())
    handler, state = _installed(scripted)
    images = torch.randn(2, 3, 16, 16)
    _call(handler.model, images)
    assert state.take()["runtime"] == "onnx"
    out = _call(handler.model, images[:1])
    assert state.take()["used"] == ["onnx"] and list(out) == ["out"]
    assert _max_diff(out, _call(scripted, images[:1])) <= TOLERANCE


class Spectrum(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.fft.rfft(x).abs()  # no ONNX exporter for aten::fft_rfft


class Scaled(torch.nn.Module):
    def forward(self, x: torch.Tensor, factors: list[float]) -> torch.Tensor:
        return x * torch.tensor(factors)


class KeywordScale(torch.nn.Module):
    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return x * scale


class PerItem(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        return [{"sum": row.sum()} for row in x]  # one dict per item: the structure follows the batch


class BatchBranch(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 if x.shape[0] > 1 else x  # tracing bakes the branch of the traced batch in


class Counted(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, int]:
        return x + 1, int(x.shape[0])


REFUSALS = [
    ("export fails", Spectrum(), (torch.randn(3, 8),), {}, "the ONNX export failed: torch.onnx.export failed: "
                                                             "UnsupportedOperatorError"),
    ("non-tensor argument", Scaled(), (torch.randn(2, 3), [1.0, 2.0, 3.0]), {},
     "argument 2 of the model's call is a list, not a tensor"),
    ("keyword argument", KeywordScale(), (torch.randn(2, 3),), {"scale": 2.0}, "keyword arguments (scale)"),
    ("per-item outputs", PerItem(), (torch.randn(3, 2),), {}, "output structure follows the batch size"),
    ("disagrees", BatchBranch(), (torch.randn(3, 2),), {}, "onnxruntime disagrees with torch: output 'output__0' "
                                                           "differs from torch's by up to"),
    ("non-tensor output", Counted(), (torch.randn(3, 2),), {}, "the model's outputs hold a value of type int"),
]


@pytest.mark.parametrize(("model", "args", "kwargs", "reason"), [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
def test_a_model_the_swap_does_not_apply_to_keeps_answering_through_torch(
        model: torch.nn.Module, args: tuple, kwargs: dict, reason: str) -> None:
    handler, state = _installed(model, "onnx")
    assert state is not None
    for _ in range(2):
        assert _max_diff(_call(handler.model, *args, **kwargs), _call(model, *args, **kwargs)) == 0.0
        report = state.take()
        assert report["runtime"] == "torch" and report["used"] == ["torch"] and not report["pending"], report
        assert reason in report["reason"], report["reason"]


def test_runtime_torch_and_handlers_without_a_model_change_nothing() -> None:
    model = Spectrum()
    handler, state = _installed(model, "torch")
    assert state is None and handler.model is model
    function_service = SimpleNamespace(_entry_point=lambda data, context: data)  # handle(data, context)
    assert "a function handler" in install(function_service, "auto", 1).take()["reason"]
    session_handler = _Handler(object())  # e.g. BaseHandler's own onnxruntime session for a .onnx file
    state = install(SimpleNamespace(_entry_point=session_handler.handle), "auto", 1)
    assert "not a torch module" in state.take()["reason"] and type(session_handler.model) is object


def test_calls_that_do_not_fit_the_graph_and_a_failing_session_go_to_torch() -> None:
    torch.manual_seed(2)
    model = torch.nn.Linear(4, 2)
    handler, state = _installed(model)
    _call(handler.model, torch.randn(2, 4))
    assert state.take()["runtime"] == "onnx"
    wanting_grad = torch.randn(2, 4, requires_grad=True)  # captum's explanations need torch's gradients
    assert handler.model(wanting_grad).requires_grad and state.take()["used"] == ["torch"]
    _call(handler.model, torch.randn(2, 3, 4))  # another rank than the graph's
    assert state.take()["used"] == ["torch"]
    _call(handler.model, torch.randn(5, 4))
    assert state.take()["used"] == ["onnx"]

    class Broken:
        def run(self, *args: Any) -> Any:
            raise RuntimeError("onnxruntime gave up")

    handler.model.runner.session = Broken()
    x = torch.randn(2, 4)
    assert _max_diff(_call(handler.model, x), _call(model, x)) == 0.0
    report = state.take()
    assert report["runtime"] == "torch" and "onnxruntime failed on a later batch" in report["reason"]
    assert handler.model.runner is None


# ------------------------------------------------------------------- archives through handler processes

PROBE_MODEL = '''\
    """Magnitudes of a spectrum: torch.fft has no ONNX exporter, so the swap cannot apply."""
    import torch


    class Spectrum(torch.nn.Module):
        def forward(self, x):
            return torch.fft.rfft(x).abs()
'''

PROBE_HANDLER = '''\
    """A BaseHandler subclass over spectrum_model.Spectrum (TorchServe wants one class in a handler module):
    JSON ``{"values": [8 numbers]}`` in, the magnitudes of their spectrum out."""
    import json

    import torch
    from spectrum_model import Spectrum

    from ts.torch_handler.base_handler import BaseHandler


    class SpectrumHandler(BaseHandler):
        def initialize(self, context):
            self.model = Spectrum().eval()
            self.device = torch.device("cpu")
            self.initialized = True

        def preprocess(self, data):
            rows = []
            for row in data:
                body = row.get("data") or row.get("body")
                if isinstance(body, (bytes, bytearray)):
                    body = json.loads(body.decode("utf-8"))
                rows.append(body["values"])
            return torch.tensor(rows, dtype=torch.float32)

        def postprocess(self, data):
            return [[round(v, 5) for v in row] for row in data.tolist()]
'''


def _build_probe(dest: Path) -> Archive:
    """An archive whose model's export fails: a handler of ours and its model module as an extra file."""
    src = dest / "spectrum"
    src.mkdir(parents=True, exist_ok=True)
    (src / "spectrum_model.py").write_text(textwrap.dedent(PROBE_MODEL))
    (src / "spectrum_handler.py").write_text(textwrap.dedent(PROBE_HANDLER))
    subprocess.run(archiver_command() + ["--model-name", "spectrum", "--version", "1.0", "--handler",
                                         str(src / "spectrum_handler.py"), "--extra-files",
                                         str(src / "spectrum_model.py"), "--export-path", str(dest), "--force"],
                   check=True, timeout=120, capture_output=True)
    values = {"ramp": {"values": [float(i) for i in range(8)]}, "wave": {"values": [1.0, -1.0] * 4}}
    return Archive("spectrum", "spectrum", dest / "spectrum.mar", values)


@pytest.fixture(scope="module")
def archives(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Archive]:
    dest = tmp_path_factory.mktemp("onnx-swap-archives")
    built = build_archives(dest, ["image_classifier", "mnist", "image_segmenter", "text_classifier", "subclass",
                                  "object_detector"])
    built["spectrum"] = _build_probe(dest)
    return built


def _request(i: int, value: Any) -> HandlerRequest:
    """A request as curl -T sends a file (bytes), or a JSON body."""
    if isinstance(value, bytes):
        return HandlerRequest(f"r{i}", [Parameter("body", value, "application/octet-stream")])
    return HandlerRequest(f"r{i}", [Parameter("body", json.dumps(value).encode(), "application/json")])


def _pool(archive: Archive, runtime: str, batch_size: int, root: Path) -> HandlerPool:
    model_dir = unpack(archive.mar, root / "unpacked")
    return HandlerPool(PoolSpec(archive.name, model_dir, read_archive(archive.mar), batch_size=batch_size,
                                max_batch_delay_ms=50, runtime=runtime, threads=1,
                                log_path=root / f"{archive.kind}-{runtime}.log"))


def _answer(pool: HandlerPool, batches: Sequence[Sequence[Any]]) -> list[list[tuple[HandlerAnswer, dict]]]:
    """Each batch's requests sent together (a batch of exactly that many: batch_size is the largest)."""
    async def run() -> list[list[tuple[HandlerAnswer, dict]]]:
        return [await asyncio.gather(*(pool.submit(_request(i, v)) for i, v in enumerate(batch))) for batch in batches]

    return asyncio.run(run())


def _started(*pools: HandlerPool) -> None:
    """Both pools' handler processes start side by side (each imports torch and the handler)."""
    with ThreadPoolExecutor(len(pools)) as starting:
        list(starting.map(lambda pool: pool.start(), pools))


# sent: all inputs as one batch (torch answers it, and the model is exported with it), then each alone
SWAPPED = ["image_classifier", "mnist", "image_segmenter", "text_classifier", "subclass"]


@pytest.mark.parametrize("kind", SWAPPED)
def test_archive_answers_with_onnx_as_with_torch(kind: str, archives: dict[str, Archive], tmp_path: Path) -> None:
    archive = archives[kind]
    values = list(archive.inputs.values())
    together = kind != "text_classifier"  # TorchServe's text_classifier reads only a batch's first request
    batches = [values, *([v] for v in values)] if together else [[v] for v in values + values[:1]]
    size = max(map(len, batches))
    torch_pool, onnx_pool = _pool(archive, "torch", size, tmp_path), _pool(archive, "onnx", size, tmp_path)
    _started(torch_pool, onnx_pool)
    try:
        expected, got = _answer(torch_pool, batches), _answer(onnx_pool, batches)
        runtimes = onnx_pool.runtimes()
        assert torch_pool.runtimes() == [{}]  # runtime torch: nothing swapped, nothing reported
    finally:
        torch_pool.close()
        onnx_pool.close()
    assert runtimes[0]["runtime"] == "onnx", runtimes
    first = got[0][0][1]
    assert first["runtime"] == "torch" and first["runtime_note"].startswith("onnx: exported to ONNX"), first
    assert all("runtime" not in timings for batch in expected for _, timings in batch)
    worst = 0.0
    for i, (want_batch, got_batch) in enumerate(zip(expected, got)):
        for (want, _), (have, timings) in zip(want_batch, got_batch):
            assert have.status == want.status == 200, (have, want)
            worst = max(worst, _max_diff(json.loads(have.body), json.loads(want.body)))
            assert timings["runtime"] == ("torch" if i == 0 else "onnx"), timings
    assert worst <= TOLERANCE, f"{kind}: answers differ by up to {worst:.2g}"


FALLBACKS = {"spectrum": "the ONNX export failed: torch.onnx.export failed: UnsupportedOperatorError",
             "object_detector": "the model's output structure follows the batch size"}


@pytest.mark.parametrize("kind", sorted(FALLBACKS))
def test_archive_the_export_does_not_apply_to_answers_through_torch(kind: str, archives: dict[str, Archive],
                                                                     tmp_path: Path) -> None:
    archive = archives[kind]
    values = list(archive.inputs.values())
    pool = _pool(archive, "onnx", len(values), tmp_path)
    pool.start()
    try:
        answered = _answer(pool, [values, values])
        report = pool.runtimes()[0]
    finally:
        pool.close()
    assert report["runtime"] == "torch" and report["requested"] == "onnx", report
    assert FALLBACKS[kind] in report["reason"], report["reason"]
    assert answered[0][0][1]["runtime_note"].startswith(f"torch: {FALLBACKS[kind]}")
    assert all(answer.status == 200 and timings["runtime"] == "torch" for batch in answered
               for answer, timings in batch)
    if kind == "spectrum":
        ramp = json.loads(answered[1][0][0].body)
        assert ramp == [round(v, 5) for v in torch.fft.rfft(torch.arange(8.0)).abs().tolist()]

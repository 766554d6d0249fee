"""torchvision's operators on CPU where its extension cannot load (serving/torchserve/vision_ops.py).

Two kinds of tests, by what they touch:

- the kernels (``nms_cpu``, ``roi_align_cpu``) against straightforward references written here in
  numpy, in this pytest process: importing ``serving.torchserve.vision_ops`` imports torch and numpy
  only; it neither imports torchvision nor defines any operator, so nothing leaks into other tests;
- everything that calls ``ensure_torchvision()`` (it defines operators in torch for the process's
  life and re-imports torchvision through sys.modules), in fresh Python processes: one runs every
  check on the real torchvision and reports JSON; another tries the other import failures on stand-in
  torchvision packages.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from serving.torchserve import vision_ops
from serving.torchserve.vision_ops import nms_cpu, roi_align_cpu

REPO = Path(__file__).resolve().parents[3]


# --- references ----------------------------------------------------------------------------------------
def reference_iou(a: np.ndarray, b: np.ndarray) -> float:
    """IoU of two float32 boxes in float32 arithmetic, each step in the order torchvision's kernel takes."""
    zero = np.float32(0)
    area_a = (a[2] - a[0]) * (a[3] - a[1])
    area_b = (b[2] - b[0]) * (b[3] - b[1])
    width = max(zero, min(a[2], b[2]) - max(a[0], b[0]))
    height = max(zero, min(a[3], b[3]) - max(a[1], b[1]))
    inter = width * height
    return float(inter / (area_a + area_b - inter))


def reference_nms(boxes: np.ndarray, scores: np.ndarray, threshold: float) -> list[int]:
    """Greedy NMS, one pair at a time. Highest score first; equal scores in index order (Python's sort
    is stable, with reverse=True too); a box goes when IoU with a kept one is strictly above the
    threshold, the float32 IoU compared with the threshold as a float64."""
    order = sorted(range(len(scores)), key=lambda i: scores[i], reverse=True)
    suppressed = [False] * len(scores)
    keep = []
    for place, i in enumerate(order):
        if suppressed[i]:
            continue
        keep.append(i)
        for j in order[place + 1:]:
            if not suppressed[j] and reference_iou(boxes[i], boxes[j]) > threshold:
                suppressed[j] = True
    return keep


def reference_bilinear(image: np.ndarray, y: float, x: float) -> np.ndarray:
    """One sample of a (C, H, W) map: 0 more than a pixel outside; clamped to the first and last pixel."""
    _, height, width = image.shape
    if y < -1.0 or y > height or x < -1.0 or x > width:
        return np.zeros(image.shape[0])
    y, x = max(y, 0.0), max(x, 0.0)
    y0, x0 = int(y), int(x)
    if y0 >= height - 1:
        y0 = y1 = height - 1
        y = float(y0)
    else:
        y1 = y0 + 1
    if x0 >= width - 1:
        x0 = x1 = width - 1
        x = float(x0)
    else:
        x1 = x0 + 1
    ly, lx = y - y0, x - x0
    return ((1 - ly) * (1 - lx) * image[:, y0, x0] + (1 - ly) * lx * image[:, y0, x1]
            + ly * (1 - lx) * image[:, y1, x0] + ly * lx * image[:, y1, x1])


def reference_roi_align(features: np.ndarray, rois: np.ndarray, scale: float, pooled: tuple[int, int],
                        sampling_ratio: int, aligned: bool) -> np.ndarray:
    """RoIAlign in float64, one sample at a time: each cell is the mean of a grid of samples
    (``sampling_ratio`` per side, or ceil(cell size) when <= 0)."""
    pooled_h, pooled_w = pooled
    out = np.zeros((len(rois), features.shape[1], pooled_h, pooled_w))
    shift = 0.5 if aligned else 0.0
    for k, (batch, x1, y1, x2, y2) in enumerate(rois.astype(np.float64)):
        start_x, start_y = x1 * scale - shift, y1 * scale - shift
        size_w, size_h = x2 * scale - shift - start_x, y2 * scale - shift - start_y
        if not aligned:
            size_w, size_h = max(size_w, 1.0), max(size_h, 1.0)
        bin_h, bin_w = size_h / pooled_h, size_w / pooled_w
        grid_h = sampling_ratio if sampling_ratio > 0 else math.ceil(size_h / pooled_h)
        grid_w = sampling_ratio if sampling_ratio > 0 else math.ceil(size_w / pooled_w)
        count = max(grid_h * grid_w, 1)
        for i in range(pooled_h):
            for j in range(pooled_w):
                total = np.zeros(features.shape[1])
                for iy in range(grid_h):
                    y = start_y + i * bin_h + (iy + 0.5) * bin_h / grid_h
                    for ix in range(grid_w):
                        x = start_x + j * bin_w + (ix + 0.5) * bin_w / grid_w
                        total += reference_bilinear(features[int(batch)], y, x)
                out[k, :, i, j] = total / count
    return out


# --- nms -------------------------------------------------------------------------------------------------
def crowded_boxes(seed: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Boxes around a few centres (many overlaps, a few exact duplicates), scores on a coarse scale
    (many ties), float32."""
    rng = np.random.default_rng(seed)
    centres = rng.uniform(20, 80, size=(5, 2))[rng.integers(0, 5, count)]
    centres += rng.normal(0, 4, size=(count, 2))
    sizes = rng.uniform(4, 30, size=(count, 2))
    boxes = np.concatenate([centres - sizes / 2, centres + sizes / 2], axis=1).astype(np.float32)
    boxes[rng.integers(0, count, 10)] = boxes[rng.integers(0, count, 10)]
    scores = (rng.integers(0, 8, count) / 8).astype(np.float32)
    return boxes, scores


@pytest.mark.parametrize("threshold", [0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0])
@pytest.mark.parametrize("seed", [0, 1])
def test_nms_keeps_what_the_reference_keeps_in_its_order(seed, threshold):
    boxes, scores = crowded_boxes(seed, 120)
    kept = nms_cpu(torch.from_numpy(boxes), torch.from_numpy(scores), threshold)
    assert kept.dtype == torch.int64
    assert kept.tolist() == reference_nms(boxes, scores, threshold)


@pytest.mark.parametrize("block", [1, 7, 256])
def test_nms_gives_the_same_whatever_block_of_rows_it_computes_at_once(monkeypatch, block):
    monkeypatch.setattr(vision_ops, "NMS_BLOCK", block)
    boxes, scores = crowded_boxes(2, 60)
    kept = nms_cpu(torch.from_numpy(boxes), torch.from_numpy(scores), 0.4)
    assert kept.tolist() == reference_nms(boxes, scores, 0.4)


def test_nms_float64_boxes():
    boxes, scores = crowded_boxes(3, 80)
    kept = nms_cpu(torch.from_numpy(boxes).double(), torch.from_numpy(scores).double(), 0.5)
    assert kept.tolist() == reference_nms(boxes, scores, 0.5)  # the float32 values are exact in float64


def test_nms_ties_keep_the_lower_index_first():
    """Equal scores: index order, also beyond 16 boxes (where torch's unstable sort would not keep it)."""
    boxes = np.array([[0, 0, 10, 10]] * 20 + [[100, 100, 110, 110]] * 20, dtype=np.float32)
    scores = np.full(40, 0.5, dtype=np.float32)
    kept = nms_cpu(torch.from_numpy(boxes), torch.from_numpy(scores), 0.5)
    assert kept.tolist() == [0, 20]
    assert kept.tolist() == reference_nms(boxes, scores, 0.5)


def test_nms_drops_only_above_the_threshold_compared_in_float64():
    """IoU exactly 0.5 stays at threshold 0.5; a float32 IoU of 0.1f (just above 0.1) goes at 0.1,
    as in torchvision's kernel, which compares float with double."""
    half = torch.tensor([[0, 0, 2, 2], [0, 0, 2, 1]], dtype=torch.float32)
    assert nms_cpu(half, torch.tensor([0.9, 0.8]), 0.5).tolist() == [0, 1]
    tenth = torch.tensor([[0, 0, 1, 1], [0, 0, 10, 1]], dtype=torch.float32)
    assert nms_cpu(tenth, torch.tensor([0.9, 0.8]), 0.1).tolist() == [0]
    assert reference_nms(tenth.numpy(), np.array([0.9, 0.8], dtype=np.float32), 0.1) == [0]


def test_nms_of_no_boxes_and_of_bad_shapes():
    assert nms_cpu(torch.zeros(0, 4), torch.zeros(0), 0.5).shape == (0,)
    with pytest.raises(RuntimeError, match="4 elements"):
        nms_cpu(torch.zeros(3, 5), torch.zeros(3), 0.5)
    with pytest.raises(RuntimeError, match="same number"):
        nms_cpu(torch.zeros(3, 4), torch.zeros(2), 0.5)


# --- roi_align -------------------------------------------------------------------------------------------
def feature_map_and_rois(seed: int, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """Two images of a (3, 13, 17) map; regions in image coordinates (map size / scale): inside,
    across the edges, past them, tiny, and malformed (x2 < x1)."""
    rng = np.random.default_rng(seed)
    features = rng.normal(size=(2, 3, 13, 17)).astype(np.float32)
    span = np.array([17, 13]) / scale
    count = 24
    corner = rng.uniform(-0.2, 1.0, size=(count, 2)) * span
    size = rng.uniform(0.02, 0.7, size=(count, 2)) * span
    size[:3] = rng.uniform(-0.05, 0.0, size=(3, 2)) * span  # malformed: ends before it starts
    batch = rng.integers(0, 2, size=(count, 1))
    rois = np.concatenate([batch, corner, corner + size], axis=1).astype(np.float32)
    return features, rois


@pytest.mark.parametrize("aligned", [True, False])
@pytest.mark.parametrize("sampling_ratio", [-1, 2])
@pytest.mark.parametrize("scale", [1.0, 0.5, 0.25])
def test_roi_align_matches_the_reference(scale, sampling_ratio, aligned):
    features, rois = feature_map_and_rois(int(scale * 8) + sampling_ratio, scale)
    pooled = (3, 4)
    got = roi_align_cpu(torch.from_numpy(features), torch.from_numpy(rois), scale, *pooled, sampling_ratio, aligned)
    assert got.dtype == torch.float32 and got.shape == (len(rois), 3, *pooled)
    want = reference_roi_align(features.astype(np.float64), rois, scale, pooled, sampling_ratio, aligned)
    np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-5)


def test_roi_align_samples_exactly_a_pixel_outside_still_count():
    """A sample at y == -1 reads the first row, one at y == height the last; a hair further, nothing."""
    features = np.arange(4 * 5, dtype=np.float32).reshape(1, 1, 4, 5)
    rois = np.array([[0, 1, -2, 2, 0], [0, 1, 3, 2, 5], [0, 1, -2.25, 2, -0.25], [0, 1, 3.25, 2, 5.25]],
                    dtype=np.float32)  # one sample per region, at y = -1, 4, -1.25, 4.25; x = 1.5
    got = roi_align_cpu(torch.from_numpy(features), torch.from_numpy(rois), 1.0, 1, 1, 1, False)
    assert got.flatten().tolist() == [1.5, 16.5, 0.0, 0.0]
    want = reference_roi_align(features.astype(np.float64), rois, 1.0, (1, 1), 1, False)
    np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-6)


def test_roi_align_float64_and_other_pooled_sizes():
    features, rois = feature_map_and_rois(5, 0.5)
    got = roi_align_cpu(torch.from_numpy(features).double(), torch.from_numpy(rois).double(), 0.5, 2, 5, 0, True)
    want = reference_roi_align(features.astype(np.float64), rois, 0.5, (2, 5), 0, True)
    np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-10)


def test_roi_align_splits_many_regions_without_changing_results(monkeypatch):
    features, rois = feature_map_and_rois(6, 1.0)
    whole = roi_align_cpu(torch.from_numpy(features), torch.from_numpy(rois), 1.0, 3, 3, -1, False)
    monkeypatch.setattr(vision_ops, "ROI_ALIGN_BUDGET", 1)  # one region at a time
    parts = roi_align_cpu(torch.from_numpy(features), torch.from_numpy(rois), 1.0, 3, 3, -1, False)
    torch.testing.assert_close(parts, whole, rtol=0, atol=0)


def test_roi_align_of_no_regions_and_of_mismatched_dtypes():
    assert roi_align_cpu(torch.zeros(1, 2, 4, 4), torch.zeros(0, 5), 1.0, 2, 2, 2, True).shape == (0, 2, 2, 2)
    with pytest.raises(RuntimeError, match="same type"):
        roi_align_cpu(torch.zeros(1, 2, 4, 4), torch.zeros(1, 5, dtype=torch.float64), 1.0, 2, 2, 2, True)


# --- ensure_torchvision, in fresh processes ---------------------------------------------------------------
def run_python(code: str, tmp_path: Path, extra_path: Path | None = None) -> dict:
    """Run ``code`` in a fresh interpreter of this venv; it prints one JSON object last."""
    path = [str(REPO)] + ([str(extra_path)] if extra_path else [])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path + [os.environ.get("PYTHONPATH", "")])}
    script = tmp_path / "check.py"
    script.write_text(textwrap.dedent(code))
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


REAL_TORCHVISION = '''
    import importlib, json, sys, threading, time

    started = time.perf_counter()
    import torch
    from serving.torchserve import vision_ops

    facts = {}
    barrier = threading.Barrier(8)
    answers = []

    def first_call():
        barrier.wait()
        answers.append(vision_ops.ensure_torchvision())

    threads = [threading.Thread(target=first_call) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    facts["answers"] = answers
    facts["again"] = vision_ops.ensure_torchvision()
    facts["reloaded"] = importlib.reload(vision_ops).ensure_torchvision()  # module state lost: no second define
    facts["finder_left"] = [type(f).__name__ for f in sys.meta_path if "vision_ops" in type(f).__module__]

    import torchvision
    import torchvision.models.detection
    from PIL import Image
    from torchvision import transforms
    from torchvision.ops import batched_nms, nms, roi_align

    facts["has_ops"] = torchvision.extension._has_ops()
    facts["cuda_version"] = torch.ops.torchvision._cuda_version()
    image = Image.new("RGB", (40, 30), (200, 10, 10))
    tensor = transforms.Compose([transforms.Resize(16), transforms.CenterCrop(16), transforms.ToTensor(),
                                 transforms.Normalize([0.5] * 3, [0.25] * 3)])(image)
    facts["transformed"] = list(tensor.shape)

    gen = torch.Generator().manual_seed(0)
    def boxes(n):
        corner = torch.rand(n, 2, generator=gen) * 100
        return torch.cat([corner, corner + 5 + torch.rand(n, 2, generator=gen) * 40], 1)

    b, s = boxes(300), torch.rand(300, generator=gen)
    facts["nms"] = torch.equal(nms(b, s, 0.5), vision_ops.nms_cpu(b, s, 0.5))
    for n in (200, 1500):  # torchvision offsets boxes per class up to 4000 numbers, loops over classes past
        b, s, c = boxes(n), torch.rand(n, generator=gen), torch.randint(0, 5, (n,), generator=gen)
        per_class = torch.cat([torch.nonzero(c == k).squeeze(1)[vision_ops.nms_cpu(b[c == k], s[c == k], 0.5)]
                               for k in range(5)])
        want = per_class[torch.sort(s[per_class], descending=True, stable=True).indices]
        facts[f"batched_nms_{n}"] = torch.equal(batched_nms(b, s, c, 0.5), want)
    x = torch.randn(2, 8, 20, 24, generator=gen)
    rois = torch.cat([torch.randint(0, 2, (30, 1), generator=gen).float(), boxes(30) / 3], 1)
    facts["roi_align"] = torch.equal(roi_align(x, rois, (7, 7), 0.5, 2, True),
                                     vision_ops.roi_align_cpu(x, rois, 0.5, 7, 7, 2, True))
    first_image = torch.cat([torch.zeros(5, 1), rois[:5, 1:]], 1)
    facts["roi_align_box_list"] = torch.equal(roi_align(x, [rois[:5, 1:]], (3, 3), 1.0, -1, False),
                                              vision_ops.roi_align_cpu(x, first_image, 1.0, 3, 3, -1, False))
    try:
        torchvision.ops.roi_pool(x, rois, (2, 2))
    except NotImplementedError as exc:
        facts["roi_pool"] = str(exc)

    from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_320_fpn
    torch.manual_seed(0)
    model = fasterrcnn_mobilenet_v3_large_320_fpn(weights=None, weights_backbone=None, box_score_thresh=0.0).eval()
    model_started = time.perf_counter()
    with torch.no_grad():
        found = model([torch.rand(3, 240, 320, generator=gen)])[0]
    facts["model_s"] = round(time.perf_counter() - model_started, 2)
    facts["detections"] = {k: [list(v.shape), str(v.dtype)] for k, v in found.items()}
    inside = (found["boxes"] >= 0).all() & (found["boxes"][:, 2] <= 320).all() & (found["boxes"][:, 3] <= 240).all()
    facts["boxes_inside"] = bool(inside)
    facts["scores_sorted"] = bool((found["scores"][:-1] >= found["scores"][1:]).all())
    facts["total_s"] = round(time.perf_counter() - started, 2)
    print(json.dumps(facts))
'''


@pytest.fixture(scope="module")
def real(tmp_path_factory) -> dict:
    """Every check on the venv's own torchvision, in one fresh process (~5 s: torch, torchvision, a model)."""
    return run_python(REAL_TORCHVISION, tmp_path_factory.mktemp("vision-real"))


def provided(facts: dict) -> None:
    if facts["answers"][0] == vision_ops.NATIVE:
        pytest.skip("torchvision's own operators load in this venv (a matched install): nothing is provided")


def test_one_answer_for_every_caller_and_no_second_definition(real):
    """Eight threads race to the first call; later calls, and a reloaded module, agree (a second
    definition of an operator would raise)."""
    assert len(set(real["answers"])) == 1 and len(real["answers"]) == 8
    assert real["answers"][0] in (vision_ops.NATIVE, vision_ops.CPU_OPS)
    assert real["again"] == real["reloaded"] == real["answers"][0]
    assert real["finder_left"] == []


def test_in_this_venv_the_operators_are_provided(real):
    provided(real)
    assert real["answers"][0] == vision_ops.CPU_OPS
    assert real["has_ops"] is True
    assert real["cuda_version"] == -1


def test_torchvision_and_its_transforms_work(real):
    assert real["transformed"] == [3, 16, 16]


def test_torchvision_ops_run_on_the_kernels(real):
    provided(real)
    assert real["nms"] and real["roi_align"] and real["roi_align_box_list"]
    assert real["batched_nms_200"] and real["batched_nms_1500"]


def test_operators_not_provided_say_which_and_what_to_install(real):
    provided(real)
    message = real["roi_pool"]
    assert "torchvision::roi_pool" in message
    assert "--index-url https://download.pytorch.org/whl/cpu" in message
    assert f"torch=={torch.__version__.split('+')[0]}" in message


def test_a_detection_model_runs_in_eval_mode(real):
    detections = real["detections"]
    assert set(detections) == {"boxes", "labels", "scores"}
    count = detections["boxes"][0][0]
    assert count > 0  # box_score_thresh=0: the untrained head's boxes come through nms
    assert detections["boxes"] == [[count, 4], "torch.float32"]
    assert detections["labels"] == [[count], "torch.int64"]
    assert detections["scores"] == [[count], "torch.float32"]
    assert real["boxes_inside"] and real["scores_sorted"]


OTHER_FAILURES = '''
    import importlib, json, sys, torch
    from serving.torchserve import vision_ops

    facts = {}
    for case in ("broken", "ops_present", "missing_dependency", "fine"):
        for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
            del sys.modules[name]
        sys.path.insert(0, case)
        importlib.invalidate_caches()
        module = importlib.reload(vision_ops)
        try:
            facts[case] = ["returned", module.ensure_torchvision()]
        except Exception as exc:
            facts[case] = ["raised", type(exc).__name__, str(exc)]
        sys.path.remove(case)
    facts["defined"] = hasattr(torch.ops.torchvision, "nms")
    print(json.dumps(facts))
'''

STAND_INS = {
    # fails in a way that has nothing to do with the operators
    "broken": {"__init__.py": "raise RuntimeError('the stand-in is broken')\n"},
    # names a torchvision:: operator, but its extension says the operators loaded: not ours to repair
    "ops_present": {"__init__.py": "from . import extension\nraise RuntimeError('operator torchvision::nms is odd')\n",
                    "extension.py": "def _has_ops():\n    return True\n"},
    "missing_dependency": {"__init__.py": "import no_such_module_for_vision_ops\n"},
    "fine": {"__init__.py": "__version__ = 'stand-in'\n"},
}


def test_other_import_failures_propagate_unchanged_and_a_working_import_is_native(tmp_path):
    for case, files in STAND_INS.items():
        package = tmp_path / case / "torchvision"
        package.mkdir(parents=True)
        for name, text in files.items():
            (package / name).write_text(text)
    facts = run_python(OTHER_FAILURES, tmp_path)
    assert facts["broken"] == ["raised", "RuntimeError", "the stand-in is broken"]
    assert facts["ops_present"] == ["raised", "RuntimeError", "operator torchvision::nms is odd"]
    assert facts["missing_dependency"] == ["raised", "ModuleNotFoundError",
                                           "No module named 'no_such_module_for_vision_ops'"]
    assert facts["fine"] == ["returned", vision_ops.NATIVE]
    assert facts["defined"] is False

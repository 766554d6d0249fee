"""torchvision's C++ operators, provided in torch where its extension cannot load (CPU workers).

Why this exists: PyPI's ``torchvision`` wheel is built against PyPI's CUDA ``torch``; its ``_C.so``
links ``libc10_cuda.so`` and ``libtorch_cuda.so``. Installed beside a CPU build of torch (``+cpu``),
which ships neither, the extension fails to load, no ``torchvision::`` operator is ever registered,
and ``import torchvision`` itself fails in ``torchvision/_meta_registrations.py`` ("operator
torchvision::nms does not exist"). TorchServe's image handlers (image_classifier, image_segmenter,
object_detector) import torchvision, and detection models call ``torchvision.ops.nms`` and
``torchvision.ops.roi_align``.

The clean installs, where a worker can reach PyTorch's index:

- GPU workers: PyPI's ``torch`` and ``torchvision`` (both CUDA builds, matched);
- CPU workers: both from PyTorch's CPU index, matched to each other, e.g.
  ``pip install torch==2.13.0 torchvision==0.28.0 --index-url https://download.pytorch.org/whl/cpu``.

Where that is not possible (only PyPI reachable, as in this project's test machines),
:func:`ensure_torchvision`, called before a handler is imported, defines the ``torchvision`` operator
library's schemas through :mod:`torch.library` with CPU kernels written here in torch for ``nms``
and ``roi_align`` (enough for torchvision.transforms, torchvision.ops and the detection models in
eval mode), a ``_cuda_version`` that says -1 (these kernels use no CUDA), and, for every other
operator, a kernel that raises :class:`NotImplementedError` naming the operator and the clean
install. It then imports torchvision again, so that torchvision's extension module reports its
operators present and torchvision registers its own Meta, autograd and autocast kernels on ours,
as it would on its own. These kernels are slower than torchvision's C++ ones (nms is a loop over the
kept boxes; roi_align gathers every sample), which is fine for serving a few images at a time.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import logging
import sys
import threading
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from types import ModuleType
from typing import Callable, Iterator, Sequence

import numpy as np
import torch

log = logging.getLogger(__name__)

NATIVE = "native"  # torchvision imported with its own operators (a matched install)
CPU_OPS = "cpu-ops"  # torchvision imported on the operators defined here

NAMESPACE = "torchvision"
EXTENSION_MODULE = "torchvision.extension"

# Every operator the installed torchvision's Python code looks up (its _meta_registrations.py registers
# Meta kernels on each one at import, so each must exist), with the schema its C++ library defines.
SCHEMAS: dict[str, str] = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "roi_align": "roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
                 "SymInt pooled_width, int sampling_ratio, bool aligned) -> Tensor",
    "_roi_align_backward": "_roi_align_backward(Tensor grad, Tensor rois, float spatial_scale, "
                           "SymInt pooled_height, SymInt pooled_width, SymInt batch_size, SymInt channels, "
                           "SymInt height, SymInt width, int sampling_ratio, bool aligned) -> Tensor",
    "qroi_align": "qroi_align(Tensor input, Tensor rois, float input_scale, int input_zero_point, "
                  "float rois_scale, int rois_zero_point, float spatial_scale, SymInt pooled_height, "
                  "SymInt pooled_width, int sampling_ratio, bool aligned) -> Tensor",
    "roi_pool": "roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
                "SymInt pooled_width) -> (Tensor, Tensor)",
    "_roi_pool_backward": "_roi_pool_backward(Tensor grad, Tensor rois, Tensor argmax, float spatial_scale, "
                          "SymInt pooled_height, SymInt pooled_width, SymInt batch_size, SymInt channels, "
                          "SymInt height, SymInt width) -> Tensor",
    "ps_roi_align": "ps_roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
                    "SymInt pooled_width, int sampling_ratio) -> (Tensor, Tensor)",
    "_ps_roi_align_backward": "_ps_roi_align_backward(Tensor grad, Tensor rois, Tensor channel_mapping, "
                              "float spatial_scale, SymInt pooled_height, SymInt pooled_width, "
                              "int sampling_ratio, SymInt batch_size, SymInt channels, SymInt height, "
                              "SymInt width) -> Tensor",
    "ps_roi_pool": "ps_roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
                   "SymInt pooled_width) -> (Tensor, Tensor)",
    "_ps_roi_pool_backward": "_ps_roi_pool_backward(Tensor grad, Tensor rois, Tensor channel_mapping, "
                             "float spatial_scale, SymInt pooled_height, SymInt pooled_width, "
                             "SymInt batch_size, SymInt channels, SymInt height, SymInt width) -> Tensor",
    "deform_conv2d": "deform_conv2d(Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias, "
                     "SymInt stride_h, SymInt stride_w, SymInt pad_h, SymInt pad_w, SymInt dilation_h, "
                     "SymInt dilation_w, SymInt groups, SymInt offset_groups, bool use_mask) -> Tensor",
    "_deform_conv2d_backward": "_deform_conv2d_backward(Tensor grad, Tensor input, Tensor weight, "
                               "Tensor offset, Tensor mask, Tensor bias, SymInt stride_h, SymInt stride_w, "
                               "SymInt pad_h, SymInt pad_w, SymInt dilation_h, SymInt dilation_w, "
                               "SymInt groups, SymInt offset_groups, bool use_mask) "
                               "-> (Tensor, Tensor, Tensor, Tensor, Tensor)",
    "box_iou_rotated": "box_iou_rotated(Tensor boxes1, Tensor boxes2) -> Tensor",
    "_cuda_version": "_cuda_version() -> int",
}

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
NMS_BLOCK = 256  # rows of the IoU matrix computed at once: bounds memory for many boxes
ROI_ALIGN_BUDGET = 1 << 23  # feature values gathered at once by roi_align (32 MiB of float32)

_lock = threading.RLock()  # re-entered when an import hook runs inside a first call
_state: str | None = None
# The operators' Library, kept for the process's life: once it is dropped, torch unregisters every
# operator it defined. Carried over when this module is executed again (importlib.reload).
_library: torch.library.Library | None = globals().get("_library")


# --- the entry point ----------------------------------------------------------------------------------
def ensure_torchvision() -> str:
    """Make ``import torchvision`` work before a handler imports it; say how: :data:`NATIVE` when
    torchvision imports as installed (nothing is touched), :data:`CPU_OPS` when its C++ extension
    could not load and the operators here were defined. Any other import failure propagates as it
    was raised. Idempotent and thread-safe: the first caller decides, later ones get its answer."""
    global _state
    with _lock:
        if _state is None:
            _state = _import_torchvision()
        return _state


def _import_torchvision() -> str:
    try:
        importlib.import_module(NAMESPACE)
    except RuntimeError as exc:
        if not _extension_missing(exc):
            raise
        reason = str(exc)
    else:
        return CPU_OPS if _extension_is_ours() else NATIVE
    _define_operators()
    _forget_torchvision()
    _import_with_operators()
    log.warning("torchvision's C++ operators did not load (%s; torchvision %s beside torch %s, a CUDA-built "
                "wheel beside a CPU torch?): using this platform's CPU kernels for nms and roi_align, slower "
                "than torchvision's; other torchvision operators raise NotImplementedError. %s",
                reason, _torchvision_version(), torch.__version__, install_hint())
    return CPU_OPS


def _extension_missing(error: RuntimeError) -> bool:
    """True only for the failure this module repairs: torchvision's extension module ran, says its
    operators could not load, the error names a ``torchvision::`` operator, and no such operator
    exists in torch (so nothing, ours included, defined them)."""
    extension = sys.modules.get(EXTENSION_MODULE)
    has_ops = getattr(extension, "_has_ops", None)
    if extension is None or not callable(has_ops) or has_ops():
        return False
    return f"{NAMESPACE}::" in str(error) and not _schema_exists("nms")


def _extension_is_ours() -> bool:
    """torchvision was already imported on this module's operators (this module imported twice)."""
    has_ops = getattr(sys.modules.get(EXTENSION_MODULE), "_has_ops", None)
    return getattr(has_ops, "__module__", None) == __name__


def _schema_exists(name: str) -> bool:
    """Whether torch knows ``torchvision::<name>``, whoever defined it."""
    return hasattr(getattr(torch.ops, NAMESPACE), name)


# --- defining the operators -------------------------------------------------------------------------------
def _define_operators() -> None:
    """Define every schema in :data:`SCHEMAS` once per process, with its CPU kernel."""
    global _library
    if _library is not None or _schema_exists("nms"):
        return
    library = torch.library.Library(NAMESPACE, "FRAGMENT")
    for name, schema in SCHEMAS.items():
        library.define(schema)
    library.impl("nms", nms_cpu, "CPU")
    library.impl("roi_align", roi_align_cpu, "CPU")
    library.impl("_cuda_version", _cuda_version, "CompositeExplicitAutograd")
    for name in SCHEMAS.keys() - {"nms", "roi_align", "_cuda_version"}:
        library.impl(name, _not_provided(name), "CPU")
    _library = library


def _cuda_version() -> int:
    """-1, as torchvision's CPU builds say: these kernels use no CUDA (torchvision.version asks)."""
    return -1


def _not_provided(name: str) -> Callable[..., object]:
    def kernel(*args: object, **kwargs: object) -> object:
        raise NotImplementedError(
            f"torchvision::{name} is not available: torchvision's C++ operators did not load (a CUDA-built "
            f"torchvision beside a CPU torch), and this platform provides only nms and roi_align for CPU. "
            f"{install_hint()}")

    kernel.__name__ = f"{name}_not_provided"
    return kernel


def install_hint() -> str:
    """The clean install for this torch, for messages."""
    vision = _torchvision_version().split("+")[0]
    pins = f"torch=={torch.__version__.split('+')[0]} torchvision" + (f"=={vision}" if vision != "unknown" else "")
    return f"Install torchvision's CPU build matched to torch: pip install {pins} --index-url {CPU_INDEX}"


def _torchvision_version() -> str:
    try:
        return version(NAMESPACE)
    except PackageNotFoundError:
        return "unknown"


# --- importing torchvision again ---------------------------------------------------------------------------
def _forget_torchvision() -> None:
    """Drop what the failed import left in sys.modules (torchvision.extension above all, which
    recorded that the operators were missing), so the next import runs every module afresh."""
    for name in [n for n in sys.modules if n == NAMESPACE or n.startswith(NAMESPACE + ".")]:
        del sys.modules[name]


def _import_with_operators() -> None:
    """Import torchvision with its extension module reporting the operators present, as it does
    when its own library loads; only for this import, whatever it raises."""
    finder = _ExtensionFinder()
    sys.meta_path.insert(0, finder)
    try:
        importlib.import_module(NAMESPACE)
    finally:
        sys.meta_path.remove(finder)


def _operators_present() -> bool:
    """Stands in for ``torchvision.extension._has_ops`` once the operators here are defined."""
    return _schema_exists("nms")


class _ExtensionFinder(importlib.abc.MetaPathFinder):
    """Finds ``torchvision.extension`` where the import system would, and has it report the
    operators present once it has run (its own check, loading ``_C.so``, still fails)."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != EXTENSION_MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _ReportingLoader(spec.loader)
        return spec


class _ReportingLoader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader) -> None:
        self.inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)  # type: ignore[attr-defined]
        module._has_ops = _operators_present  # type: ignore[attr-defined]
        module.__loader__ = self.inner  # source lookups (tracebacks, inspect) go to the real loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.inner


# --- nms ---------------------------------------------------------------------------------------------------
def nms_cpu(dets: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """Greedy non-maximum suppression, as torchvision's ``nms``: the indices of the kept boxes
    (``x1, y1, x2, y2``), highest score first; a box is dropped when its IoU with a kept box is
    greater than ``iou_threshold``. IoU is computed in the boxes' dtype with torchvision's formula,
    and compared with the threshold in float64 (as its C++ kernel does), so the kept set is the same.

    Equal scores: the box with the lower index comes first (a stable sort). torchvision documents
    the order of tied boxes as unspecified (its CPU kernel uses torch's unstable sort, which keeps
    index order only for up to 16 boxes); here it is deterministic."""
    _check_nms_inputs(dets, scores)
    if dets.numel() == 0:
        return torch.empty(0, dtype=torch.long)
    order = torch.sort(scores, descending=True, stable=True).indices
    boxes = dets.detach()[order]
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    kept = _greedy_keep(boxes, areas, iou_threshold)
    return order[torch.as_tensor(kept, dtype=torch.long)]


def _check_nms_inputs(dets: torch.Tensor, scores: torch.Tensor) -> None:
    torch._check(dets.dim() == 2, lambda: f"boxes should be a 2d tensor, got {dets.dim()}D")
    torch._check(dets.size(1) == 4, lambda: f"boxes should have 4 elements in dimension 1, got {dets.size(1)}")
    torch._check(scores.dim() == 1, lambda: f"scores should be a 1d tensor, got {scores.dim()}D")
    torch._check(dets.size(0) == scores.size(0),
                 lambda: f"boxes and scores should have same number of elements in dimension 0, "
                         f"got {dets.size(0)} and {scores.size(0)}")
    torch._check(dets.dtype == scores.dtype and dets.is_floating_point(),
                 lambda: f"dets and scores should be of one floating dtype, got {dets.dtype} and {scores.dtype}")


def _greedy_keep(boxes: torch.Tensor, areas: torch.Tensor, iou_threshold: float) -> list[int]:
    """Positions (in score order) of the boxes kept. Rows of the "overlaps too much" matrix are made
    a block at a time; a kept box suppresses every later box its row marks."""
    count = boxes.size(0)
    suppressed = np.zeros(count, dtype=bool)
    kept: list[int] = []
    for start in range(0, count, NMS_BLOCK):
        stop = min(start + NMS_BLOCK, count)
        over = _overlapping(boxes, areas, start, stop, iou_threshold)
        for row in range(stop - start):
            if suppressed[start + row]:
                continue
            kept.append(start + row)
            suppressed[start:] |= over[row]
    return kept


def _overlapping(boxes: torch.Tensor, areas: torch.Tensor, start: int, stop: int,
                 iou_threshold: float) -> np.ndarray:
    """Whether IoU(box i, box j) > threshold, for rows i in [start, stop), columns j >= start."""
    rows, cols = boxes[start:stop, None, :], boxes[None, start:, :]
    width = (torch.minimum(rows[..., 2], cols[..., 2]) - torch.maximum(rows[..., 0], cols[..., 0])).clamp(min=0)
    height = (torch.minimum(rows[..., 3], cols[..., 3]) - torch.maximum(rows[..., 1], cols[..., 1])).clamp(min=0)
    inter = width * height
    iou = inter / (areas[start:stop, None] + areas[None, start:] - inter)
    return (iou.double() > iou_threshold).numpy()


# --- roi_align -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Rois:
    """Each region's place on the feature map and its sampling grid, as torchvision's kernel sets them."""

    batch: torch.Tensor  # (K,) int64: which image of the batch
    start_y: torch.Tensor  # (K,) top edge in feature-map pixels
    start_x: torch.Tensor
    bin_h: torch.Tensor  # (K,) height of one output cell
    bin_w: torch.Tensor
    grid_h: torch.Tensor  # (K,) int64: samples per cell along y (<= 0: none, the output stays 0)
    grid_w: torch.Tensor

    def take(self, index: torch.Tensor) -> _Rois:
        return _Rois(*(getattr(self, f)[index] for f in self.__dataclass_fields__))


def roi_align_cpu(input: torch.Tensor, rois: torch.Tensor, spatial_scale: float, pooled_height: int,
                  pooled_width: int, sampling_ratio: int, aligned: bool) -> torch.Tensor:
    """RoIAlign as torchvision's ``roi_align`` operator: for each region ``[batch, x1, y1, x2, y2]``
    (image coordinates, times ``spatial_scale``; shifted by half a pixel when ``aligned``; at least
    1x1 when not), the mean of bilinear samples on a regular grid in each of the
    ``pooled_height x pooled_width`` cells (``sampling_ratio`` per side, or ceil(cell size) when
    <= 0); samples more than a pixel outside the map count as 0. Computed in float32 at least."""
    _check_roi_inputs(input, rois)
    count, channels = rois.size(0), input.size(1)
    output = input.new_zeros((count, channels, pooled_height, pooled_width))
    if output.numel() == 0:
        return output
    work = torch.promote_types(input.dtype, torch.float32)
    height, width = input.size(2), input.size(3)
    features = input.detach().to(work).permute(0, 2, 3, 1).reshape(-1, channels)  # one row per pixel
    regions = _regions(rois.detach().to(work), spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned)
    torch._check(bool(((regions.batch >= 0) & (regions.batch < input.size(0))).all()),
                 lambda: f"roi_align: a region's batch index is outside [0, {input.size(0)})")
    for grid_h, grid_w, members in _same_grid(regions):
        per_region = pooled_height * pooled_width * grid_h * grid_w * 4 * channels
        for part in members.split(max(1, ROI_ALIGN_BUDGET // per_region)):
            pooled = _pool(features, regions.take(part), grid_h, grid_w, pooled_height, pooled_width,
                           height, width)
            output[part] = pooled.to(input.dtype)
    return output


def _check_roi_inputs(input: torch.Tensor, rois: torch.Tensor) -> None:
    torch._check(input.dim() == 4, lambda: f"input must be a 4d tensor (N, C, H, W), got {input.dim()}D")
    torch._check(rois.dim() == 2 and rois.size(1) == 5, lambda: "rois must have shape as Tensor[K, 5]")
    torch._check(input.dtype == rois.dtype,
                 lambda: f"Expected tensor for input to have the same type as tensor for rois; "
                         f"but type {input.dtype} does not equal {rois.dtype}")
    torch._check(input.is_floating_point(), lambda: f"roi_align needs a floating input, got {input.dtype}")


def _regions(rois: torch.Tensor, spatial_scale: float, pooled_height: int, pooled_width: int,
             sampling_ratio: int, aligned: bool) -> _Rois:
    """torchvision's geometry: the scale is applied in the rois' dtype, the half-pixel shift when
    aligned, regions forced to 1x1 at least when not, the adaptive grid is ceil(size / cells)."""
    scale = torch.tensor(spatial_scale, dtype=rois.dtype)
    shift = 0.5 if aligned else 0.0
    start_x, start_y = rois[:, 1] * scale - shift, rois[:, 2] * scale - shift
    end_x, end_y = rois[:, 3] * scale - shift, rois[:, 4] * scale - shift
    size_w, size_h = end_x - start_x, end_y - start_y
    if not aligned:
        size_w, size_h = size_w.clamp(min=1.0), size_h.clamp(min=1.0)
    if sampling_ratio > 0:
        grid_h = grid_w = torch.full_like(size_h, sampling_ratio, dtype=torch.long)
    else:
        grid_h = torch.ceil(size_h / pooled_height).long()
        grid_w = torch.ceil(size_w / pooled_width).long()
    return _Rois(batch=rois[:, 0].long(), start_y=start_y, start_x=start_x, bin_h=size_h / pooled_height,
                 bin_w=size_w / pooled_width, grid_h=grid_h, grid_w=grid_w)


def _same_grid(regions: _Rois) -> Iterator[tuple[int, int, torch.Tensor]]:
    """Regions grouped by sampling grid, so each group is computed without padding or masks;
    regions with an empty grid (malformed, aligned) are left out: their output is 0."""
    pairs = torch.stack([regions.grid_h, regions.grid_w], dim=1)
    grids, which = torch.unique(pairs, dim=0, return_inverse=True)
    for group, (grid_h, grid_w) in enumerate(grids.tolist()):
        if grid_h > 0 and grid_w > 0:
            yield grid_h, grid_w, torch.nonzero(which == group).squeeze(1)


def _pool(features: torch.Tensor, regions: _Rois, grid_h: int, grid_w: int, pooled_height: int,
          pooled_width: int, height: int, width: int) -> torch.Tensor:
    """(K, C, PH, PW) means of the samples of K regions sharing one grid. The bilinear weight of a
    sample factors into a weight along y and one along x, so the corner pixels and weights are built
    per axis and combined into one gather of (K, PH, PW, samples x 4 corners) feature rows."""
    ys, wy = _axis(_sample_positions(regions.start_y, regions.bin_h, pooled_height, grid_h), height)
    xs, wx = _axis(_sample_positions(regions.start_x, regions.bin_w, pooled_width, grid_w), width)
    count = regions.batch.size(0)
    # (K, PH, gh, 2) and (K, PW, gw, 2) -> (K, PH, PW, gh * 2 * gw * 2)
    rows = (regions.batch[:, None, None, None, None, None, None] * (height * width)
            + ys[:, :, None, :, :, None, None] * width + xs[:, None, :, None, None, :, :])
    weights = wy[:, :, None, :, :, None, None] * wx[:, None, :, None, None, :, :]
    rows = rows.reshape(count, pooled_height, pooled_width, -1)
    weights = weights.reshape(count, pooled_height, pooled_width, 1, -1)
    summed = (weights @ features[rows]).squeeze(-2)  # (K, PH, PW, C)
    return (summed / (grid_h * grid_w)).permute(0, 3, 1, 2)


def _sample_positions(start: torch.Tensor, bin_size: torch.Tensor, cells: int, grid: int) -> torch.Tensor:
    """(K, cells, grid) sample coordinates along one axis: start + cell * bin + (i + 0.5) * bin / grid,
    in that order of operations (torchvision's)."""
    cell = torch.arange(cells, dtype=start.dtype)
    step = torch.arange(grid, dtype=start.dtype) + 0.5
    corner = start[:, None, None] + cell[None, :, None] * bin_size[:, None, None]
    return corner + step[None, None, :] * bin_size[:, None, None] / grid


def _axis(position: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The two neighbouring pixel indices of each sample along one axis and their linear weights,
    (..., 2) each: a sample more than a pixel outside [0, size] (or NaN) weighs 0; one before 0 reads
    pixel 0; one at or past the last pixel reads the last pixel."""
    inside = (position >= -1.0) & (position <= size)
    clamped = position.nan_to_num(0.0).clamp(0.0, float(size))
    low = clamped.long()  # >= 0, so truncation is floor
    at_edge = low >= size - 1
    low = torch.where(at_edge, size - 1, low)
    high = torch.where(at_edge, low, low + 1)
    frac = torch.where(at_edge, 0.0, clamped - low.to(clamped.dtype))
    weights = torch.stack([1.0 - frac, frac], dim=-1) * inside[..., None]
    return torch.stack([low, high], dim=-1), weights

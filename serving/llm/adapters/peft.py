"""LoRA adapters as model versions: what a PEFT adapter folder is, checked against its base model.

A PEFT folder (``save_pretrained`` of a ``PeftModel``) holds ``adapter_config.json`` (``r``,
``lora_alpha``, ``target_modules``, ...) and ``adapter_model.safetensors`` (``lora_A``/``lora_B`` of each
adapted module). It is uploaded as one version of its own that names its base version
(``serving model upload --path ADAPTER --base BASE:VERSION``), and served inside its base's engines,
loaded at runtime (serving/llm/launch/launcher.py).

The checks compare tensors, not names: each ``...<module>.lora_A.weight`` must adapt a weight the base
really has (``<module>.weight`` in the base's safetensors), ``lora_A`` shaped ``[r, in]`` and ``lora_B``
``[out, r]`` for that weight's ``[out, in]``. An adapter trained on another architecture or size names
modules the base lacks or has other shapes, and is refused naming the first such module. Only the
safetensors headers are read (a few kB of a multi-gigabyte base folder).
"""
from __future__ import annotations

import json
import struct
import tarfile
from pathlib import Path
from typing import Any, BinaryIO

FRAMEWORK = "hf-lora"
CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"
# vLLM's --max-lora-rank takes these (vllm/config/lora.py, MaxLoRARanks)
ENGINE_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
DEFAULT_MAX_LORAS = 4   # adapters one engine batches together (vLLM --max-loras); more are swapped in turn
PREFIX = "base_model.model."
MAX_HEADER = 100 << 20


class AdapterError(ValueError):
    """The folder is not a LoRA adapter the platform can serve on that base (the message says why)."""


def engine_rank(rank: int) -> int:
    """The smallest ``--max-lora-rank`` vLLM takes that holds ``rank``."""
    for allowed in ENGINE_RANKS:
        if rank <= allowed:
            return allowed
    raise AdapterError(f"LoRA rank {rank} is above vLLM's largest max_lora_rank ({ENGINE_RANKS[-1]})")


def is_adapter_folder(path: Path) -> bool:
    return path.is_dir() and (path / CONFIG).is_file()


def safetensors_header(f: BinaryIO) -> dict[str, Any]:
    """Tensor name -> {"dtype", "shape", ...} of a safetensors stream (8-byte length, then JSON)."""
    raw = f.read(8)
    if len(raw) != 8:
        raise AdapterError("a safetensors file is truncated")
    (size,) = struct.unpack("<Q", raw)
    if size > MAX_HEADER:
        raise AdapterError("a safetensors header is larger than 100 MB")
    try:
        header = json.loads(f.read(size))
    except ValueError as exc:
        raise AdapterError(f"a safetensors header is not JSON: {exc}") from None
    return {k: v for k, v in header.items() if k != "__metadata__"}


def base_weights(archive: Path) -> dict[str, list[int]]:
    """Weight name -> shape, from every ``*.safetensors`` of an uploaded base folder (tar)."""
    shapes: dict[str, list[int]] = {}
    with tarfile.open(archive, "r:") as tar:
        for member in tar.getmembers():
            if member.isfile() and member.name.endswith(".safetensors"):
                f = tar.extractfile(member)
                if f is not None:
                    shapes |= {k: list(v.get("shape") or []) for k, v in safetensors_header(f).items()}
    return shapes


def read_adapter(archive: Path) -> tuple[dict[str, Any], dict[str, list[int]]]:
    """``adapter_config.json`` and the adapter's tensor shapes, from an uploaded adapter folder (tar)."""
    try:
        with tarfile.open(archive, "r:") as tar:
            names = {m.name: m for m in tar.getmembers() if m.isfile()}
            if CONFIG not in names:
                raise AdapterError(f"the folder has no {CONFIG}: give a PEFT adapter folder (save_pretrained's output)")
            if WEIGHTS not in names:
                raise AdapterError(f"the folder has no {WEIGHTS} (the adapter's weights, as safetensors)")
            try:
                config = json.loads(tar.extractfile(names[CONFIG]).read())
            except ValueError as exc:
                raise AdapterError(f"{CONFIG} is not valid JSON: {exc}") from None
            tensors = {k: list(v.get("shape") or []) for k, v in safetensors_header(tar.extractfile(names[WEIGHTS])).items()}
    except tarfile.TarError as exc:
        raise AdapterError(f"not a folder uploaded by `serving model upload --path FOLDER` ({exc})") from None
    if not isinstance(config, dict):
        raise AdapterError(f"{CONFIG} is not a JSON object")
    return config, tensors


def adapter_signature(config: dict[str, Any], tensors: dict[str, list[int]], base: dict[str, list[int]],
                      base_ref: dict[str, Any]) -> dict[str, Any]:
    """The adapter's facts as its version's signature (``{"lora": ...}``); AdapterError naming what does not
    match the base. ``base_ref``: {"name", "version", "artifact"} of the base version."""
    peft = str(config.get("peft_type") or "LORA").upper()
    if peft != "LORA":
        raise AdapterError(f"{CONFIG} says peft_type {peft}: only LoRA adapters are served")
    rank = config.get("r")
    if not isinstance(rank, int) or rank <= 0:
        raise AdapterError(f"{CONFIG} gives no rank r (a positive integer): {rank!r}")
    if str(config.get("bias") or "none") != "none":
        raise AdapterError(f"{CONFIG} has bias {config.get('bias')!r}: vLLM serves adapters without bias terms only")
    if config.get("modules_to_save"):
        raise AdapterError(f"{CONFIG} has modules_to_save {config['modules_to_save']}: vLLM loads LoRA weights only")
    ranks = [rank, *(r for r in (config.get("rank_pattern") or {}).values() if isinstance(r, int))]
    modules = _check_tensors(tensors, base)
    return {"lora": {"base": base_ref, "rank": max(ranks), "alpha": config.get("lora_alpha"),
                     "target_modules": sorted(modules)}}


def _check_tensors(tensors: dict[str, list[int]], base: dict[str, list[int]]) -> set[str]:
    pairs: dict[str, dict[str, list[int]]] = {}
    for name, shape in tensors.items():
        for part in ("lora_A", "lora_B"):
            marker = f".{part}."
            if marker in name:
                module = name.split(marker)[0].removeprefix(PREFIX)
                pairs.setdefault(module, {})[part] = shape
    if not pairs:
        raise AdapterError(f"{WEIGHTS} has no lora_A/lora_B tensors")
    for module, pair in sorted(pairs.items()):
        weight = base.get(f"{module}.weight")
        if weight is None:
            raise AdapterError(f"the adapter adapts {module}, which the base model does not have (another "
                               "architecture, or target modules the base lacks)")
        a, b = pair.get("lora_A"), pair.get("lora_B")
        if a is None or b is None or len(a) != 2 or len(b) != 2 or len(weight) != 2:
            raise AdapterError(f"the adapter's {module} needs a 2-D lora_A and lora_B for the base's 2-D weight")
        if a[1] != weight[1] or b[0] != weight[0] or a[0] != b[1]:
            raise AdapterError(f"the adapter's {module} is sized for another model: lora_A {a} and lora_B {b} "
                               f"do not fit the base's weight {weight} ([out, in])")
    return {m.rsplit(".", 1)[-1] for m in pairs}

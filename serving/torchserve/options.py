"""A TorchServe endpoint's options: what registration may set over the archive's model-config.yaml.

TorchServe takes ``batch_size``, ``max_batch_delay`` (ms), ``response_timeout`` (s) and the worker
counts at registration (``POST /models?...``) or from model-config.yaml; registration wins. Here
they are the endpoint's engine options, set by the management API, ``serving model add
--engine torchserve --aux-config batch_size=8`` or the API's ``engine_options``; ``workers`` is
the number of handler processes in each worker process (TorchServe's ``min_worker``/
``initial_workers``; docs/torchserve.md says how it maps). ``threads``: torch threads in each.
``runtime`` (ours, not TorchServe's): ``torch`` runs the handler's model as archived; ``onnx`` and
``auto`` put onnxruntime in its place where the export agrees (serving/torchserve/onnx_swap.py).
"""
from __future__ import annotations

from typing import Any, Mapping

from serving.torchserve.archive import ArchiveInfo

# option -> (highest value, model-config.yaml key whose value it replaces)
OPTIONS: dict[str, tuple[int, str]] = {
    "batch_size": (4096, "batchSize"),
    "max_batch_delay": (600_000, "maxBatchDelay"),
    "response_timeout": (86_400, "responseTimeout"),
    "workers": (64, "minWorkers"),
    "threads": (256, ""),
}
# option -> the words it takes, the first its default
CHOICES: dict[str, tuple[str, ...]] = {"runtime": ("torch", "onnx", "auto")}


class OptionError(ValueError):
    pass


def check_options(options: Mapping[str, Any]) -> dict[str, int | str]:
    """Whole numbers within bounds and words among their choices, by name; an unknown name or a bad value
    is an OptionError naming it."""
    checked: dict[str, int | str] = {}
    for name, value in options.items():
        if name in CHOICES:
            checked[name] = _choice(name, value)
            continue
        if name not in OPTIONS:
            raise OptionError(f"unknown torchserve option {name!r}; the options are "
                              f"{', '.join([*OPTIONS, *CHOICES])}")
        try:
            number = int(str(value).strip())
        except ValueError:
            raise OptionError(f"torchserve option {name} must be a whole number, not {value!r}") from None
        low = 0 if name in ("max_batch_delay", "threads") else 1
        if not low <= number <= OPTIONS[name][0]:
            raise OptionError(f"torchserve option {name} must be between {low} and {OPTIONS[name][0]}, not {number}")
        checked[name] = number
    return checked


def _choice(name: str, value: Any) -> str:
    word = str(value).strip().lower()
    if word not in CHOICES[name]:
        raise OptionError(f"torchserve option {name} must be one of {', '.join(CHOICES[name])}, not {value!r}")
    return word


def effective(info: ArchiveInfo, options: Mapping[str, Any]) -> dict[str, Any]:
    """What the handler runs with: the endpoint's options over the archive's model-config.yaml over
    TorchServe's defaults (batch 1, 100 ms, 120 s, one process), and the runtime (torch by default)."""
    return {
        "batch_size": int(options.get("batch_size") or info.batch_size),
        "max_batch_delay": int(options["max_batch_delay"] if "max_batch_delay" in options else info.max_batch_delay_ms),
        "response_timeout": int(options.get("response_timeout") or info.response_timeout_s),
        "workers": int(options.get("workers") or info.config.get("minWorkers") or 1),
        "threads": int(options.get("threads") or 0),
        "runtime": str(options.get("runtime") or CHOICES["runtime"][0]).strip().lower(),
    }

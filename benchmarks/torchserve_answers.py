"""The TorchServe benchmark's first check: every system answers each input as TorchServe does, as JSON
within :data:`TOLERANCE`, before any of them is timed (benchmarks/torchserve.py)."""
from __future__ import annotations

import json
from typing import Any

import httpx

TOLERANCE = 1e-5


class Mismatch(ValueError):
    pass


def _max_diff(want: Any, have: Any, where: str = "answer") -> float:
    """The largest difference between two JSON values of the same shape; Mismatch where they differ
    otherwise (keys, lengths, types, strings) or a number by more than :data:`TOLERANCE`."""
    if isinstance(want, bool) or isinstance(have, bool) or not isinstance(want, (int, float)):
        if isinstance(want, dict) and isinstance(have, dict):
            if set(want) != set(have):
                raise Mismatch(f"{where}: keys {sorted(want)} against {sorted(have)}")
            return max((_max_diff(want[k], have[k], f"{where}[{k!r}]") for k in want), default=0.0)
        if isinstance(want, list) and isinstance(have, list):
            if len(want) != len(have):
                raise Mismatch(f"{where}: {len(want)} items against {len(have)}")
            return max((_max_diff(a, b, f"{where}[{i}]") for i, (a, b) in enumerate(zip(want, have))), default=0.0)
        if want != have:
            raise Mismatch(f"{where}: {json.dumps(want)[:80]} against {json.dumps(have)[:80]}")
        return 0.0
    if not isinstance(have, (int, float)) or isinstance(have, bool):
        raise Mismatch(f"{where}: {want} against {json.dumps(have)[:80]}")
    diff = abs(float(want) - float(have))
    if diff > TOLERANCE:
        raise Mismatch(f"{where}: {want} against {have} (differs by {diff:.3g})")
    return diff


def compare(want: str, have: str) -> dict:
    """One answer against the reference's: equal as JSON within the tolerance, and the largest
    difference; ``identical`` when the bytes are the same."""
    out: dict[str, Any] = {"identical": want == have}
    try:
        out["max_abs_diff"] = _max_diff(json.loads(want), json.loads(have))
        out["equal"] = True
    except json.JSONDecodeError:
        out.update(equal=want == have, max_abs_diff=None if want == have else float("inf"),
                   problem=None if want == have else "not JSON, and not the same bytes")
    except Mismatch as exc:
        out.update(equal=False, max_abs_diff=None, problem=str(exc))
    return out


def answers(url: str, inputs: dict[str, bytes]) -> dict[str, str]:
    """Each input's answer, one request at a time (a batch of one everywhere)."""
    out = {}
    with httpx.Client(timeout=300) as http:
        for name, body in inputs.items():
            answer = http.put(url, content=body)
            if answer.status_code != 200:
                raise RuntimeError(f"{url} answered {answer.status_code} to {name}: {answer.text[:300]}")
            out[name] = answer.text
    return out


def check_answers(reference: dict[str, str], got: dict[str, str]) -> dict:
    """Every input's answer against the reference's: all equal, the largest difference, the first problem."""
    results = {name: compare(reference[name], got[name]) for name in reference}
    diffs = [r["max_abs_diff"] for r in results.values() if r.get("max_abs_diff") is not None]
    problems = [f"{name}: {r['problem']}" for name, r in results.items() if r.get("problem")]
    return {"equal": all(r["equal"] for r in results.values()), "max_abs_diff": max(diffs) if diffs else None,
            "identical": all(r["identical"] for r in results.values()), "problem": problems[0] if problems else None}

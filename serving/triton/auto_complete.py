"""The tensors a Python-backend ``model.py`` declares in its ``auto_complete_config``, read without running it.

Why: a ``model.py`` uploaded without its ``config.pbtxt`` has no inputs or outputs Triton can see unless
the model declares them itself (Triton calls ``TritonPythonModel.auto_complete_config`` at load) or the user
names them (ClearML's ``--input-name/--input-type/--input-size`` flags). The platform binds tensors by name,
so it needs the declaration at upload, not only inside Triton: it reads the ``add_input``/``add_output``
calls of that method from the source, as Triton's own examples write them (a dict literal, or a list of
dict literals bound to a name and added in a ``for`` loop), and ``set_max_batch_size``. Nothing is
executed: an uploaded file is never run in the control plane. A declaration it cannot read is reported
as such, so the control plane can say which way is left.
"""
from __future__ import annotations

import ast
from typing import Any

ADDERS = {"add_input": "inputs", "add_output": "outputs"}


class Unreadable(ValueError):
    """``auto_complete_config`` declares tensors in a way that cannot be read without running it."""


def declared_tensors(source: str) -> dict[str, Any] | None:
    """The signature ``auto_complete_config`` declares (whole shapes, the batch dimension as -1 when its
    max_batch_size > 0), or None when the model defines no such method."""
    method = _method(source)
    if method is None:
        return None
    lists = _literal_lists(method)
    found: dict[str, list[dict[str, Any]]] = {"inputs": [], "outputs": []}
    max_batch = 0
    for node in ast.walk(method):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args):
            continue
        if node.func.attr in ADDERS:
            found[ADDERS[node.func.attr]] += _tensors(node.args[0], lists, method)
        elif node.func.attr == "set_max_batch_size":
            max_batch = _literal(node.args[0], int, "set_max_batch_size's argument")
    if not found["inputs"] and not found["outputs"]:
        return None
    return {kind: [_signature_tensor(t, max_batch) for t in tensors] for kind, tensors in found.items()} | \
        {"max_batch_size": max_batch}


def _method(source: str) -> ast.FunctionDef | None:
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise Unreadable(f"model.py does not parse: {exc.msg} (line {exc.lineno})") from None
    for cls in tree.body:
        if isinstance(cls, ast.ClassDef) and cls.name == "TritonPythonModel":
            for item in cls.body:
                if isinstance(item, ast.FunctionDef) and item.name == "auto_complete_config":
                    return item
    return None


def _literal_lists(method: ast.FunctionDef) -> dict[str, list[Any]]:
    """Names bound to a literal list (or tuple) in the method: ``inputs = [{...}, ...]``."""
    out: dict[str, list[Any]] = {}
    for node in ast.walk(method):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                value = ast.literal_eval(node.value)
            except (ValueError, SyntaxError):
                continue
            if isinstance(value, (list, tuple)):
                out[node.targets[0].id] = list(value)
    return out


def _tensors(arg: ast.expr, lists: dict[str, list[Any]], method: ast.FunctionDef) -> list[dict[str, Any]]:
    if isinstance(arg, ast.Dict):
        return [_literal(arg, dict, "a tensor")]
    if isinstance(arg, ast.Name):
        for loop in ast.walk(method):  # the loop this call stands in, over a literal list, binding its name
            if (isinstance(loop, ast.For) and isinstance(loop.target, ast.Name) and loop.target.id == arg.id
                    and isinstance(loop.iter, ast.Name) and loop.iter.id in lists
                    and any(node is arg for stmt in loop.body for node in ast.walk(stmt))):
                return [t for t in lists[loop.iter.id] if isinstance(t, dict)]
    raise Unreadable(f"auto_complete_config adds a tensor from an expression that is not a literal "
                     f"(line {arg.lineno}): write it as a dict literal, or a literal list added in a for loop")


def _literal(node: ast.expr, kind: type, what: str) -> Any:
    try:
        value = ast.literal_eval(node)
    except (ValueError, SyntaxError):
        value = None
    if not isinstance(value, kind):
        raise Unreadable(f"auto_complete_config: {what} is not a literal {kind.__name__} (line {node.lineno})")
    return value


def _signature_tensor(tensor: dict[str, Any], max_batch: int) -> dict[str, Any]:
    try:
        name, dtype, dims = str(tensor["name"]), str(tensor["data_type"]), [int(d) for d in tensor["dims"]]
    except (KeyError, TypeError, ValueError):
        raise Unreadable(f"auto_complete_config: tensor {tensor!r} needs a name, a data_type and dims") from None
    dtype = dtype.removeprefix("TYPE_")
    return {"name": name, "dtype": "BYTES" if dtype == "STRING" else dtype,
            "shape": [-1, *dims] if max_batch > 0 else dims}

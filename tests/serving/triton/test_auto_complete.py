"""Reading a Python-backend model.py's ``auto_complete_config`` without running it
(serving/triton/auto_complete.py), in the ways Triton's own documentation writes it."""
from __future__ import annotations

import pytest

from serving.triton.auto_complete import Unreadable, declared_tensors

LOOP = '''
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        inputs = [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]},
                  {"name": "TEXT", "data_type": "TYPE_STRING", "dims": [-1]}]
        outputs = [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}]
        config = auto_complete_model_config.as_dict()
        names = [i["name"] for i in config["input"]]
        for input in inputs:
            if input["name"] not in names:
                auto_complete_model_config.add_input(input)
        for input in outputs:  # the same loop name twice: each call reads its own loop's list
            auto_complete_model_config.add_output(input)
        auto_complete_model_config.set_max_batch_size(8)
        return auto_complete_model_config

    def execute(self, requests):
        return []
'''

DIRECT = '''
class TritonPythonModel:
    @staticmethod
    def auto_complete_config(c):
        c.add_input({"name": "X", "data_type": "TYPE_INT64", "dims": [2, 3]})
        c.add_output({"name": "Y", "data_type": "TYPE_INT64", "dims": [2, 3]})
        return c
'''


def test_a_literal_list_added_in_a_loop_with_a_batch_size():
    assert declared_tensors(LOOP) == {
        "inputs": [{"name": "INPUT0", "dtype": "FP32", "shape": [-1, 4]},
                   {"name": "TEXT", "dtype": "BYTES", "shape": [-1, -1]}],
        "outputs": [{"name": "OUTPUT0", "dtype": "FP32", "shape": [-1, 4]}],
        "max_batch_size": 8}


def test_dict_literals_without_batching_keep_their_whole_shapes():
    assert declared_tensors(DIRECT) == {"inputs": [{"name": "X", "dtype": "INT64", "shape": [2, 3]}],
                                        "outputs": [{"name": "Y", "dtype": "INT64", "shape": [2, 3]}],
                                        "max_batch_size": 0}


def test_no_method_no_declaration():
    assert declared_tensors("class TritonPythonModel:\n    def execute(self, requests):\n        return []\n") is None


@pytest.mark.parametrize("source, said", [
    (DIRECT.replace('{"name": "X", "data_type": "TYPE_INT64", "dims": [2, 3]}', "make_input()"), "not a literal"),
    (DIRECT.replace('"dims": [2, 3]}', '"shape": [2, 3]}', 1), "needs a name, a data_type and dims"),
    ("class TritonPythonModel:\n  def auto_complete_config(c:\n", "does not parse"),
])
def test_what_cannot_be_read_says_why(source, said):
    with pytest.raises(Unreadable, match=said):
        declared_tensors(source)

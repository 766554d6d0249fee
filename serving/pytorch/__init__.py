"""Plain PyTorch files, uploaded as users have them and served without an export step of theirs.

Three kinds (``kinds.py``): a TorchScript archive (``torch.jit.save``), an exported program
(``torch.export.save``, ``.pt2``), and a state dict with the Python file defining its ``nn.Module``
class, as ``torch-model-archiver --model-file model.py --serialized-file weights.pt`` takes them
(packed into one artifact: ``archive.py``). On upload the platform exports the model to ONNX where it
can and checks that onnxruntime agrees with torch on sample inputs of several batch sizes
(``export.py``); where it does, the version is an ONNX model like any other (engines triton and
onnxruntime), and where it cannot, the version keeps its PyTorch file and is served by the worker's
``torch`` engine (serving/worker/engines/torch.py). ``choose.py`` makes that choice and says why.

Where the export runs: on the client, in ``serving model upload`` (serving/cli/pytorch_upload.py),
as serving/embeddings/export.py does for sentence-transformers folders, not in the control plane.
Why: a state dict comes with the user's own Python file, and exporting means importing and running
it; on the client that is the user's own code on the user's machine, while in the control plane it
would be arbitrary code in the process holding the registry's database and tokens. The control plane
also needs no torch, and spends no CPU on exports and agreement runs. The API takes what the CLI
sends (an ONNX file with the agreement figures in its metadata, or a PyTorch artifact with its
signature: registry/pytorch_models.py checks its layout without running it).
"""

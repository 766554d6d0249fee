"""Encoder endpoints, embeddings and rerank, as one package (docs/embeddings.md).

- ``openai.py`` and ``tei.py``: the two front ends (OpenAI's ``/v1/embeddings``, Hugging Face TEI's API);
- ``batching.py``, ``token_batcher.py``, ``call_cost.py``: requests' texts batched into engine calls by
  tokens, at the price of one more call;
- ``events.py``, ``metrics.py``: the ``embedding`` object of a request's statistics event, and its
  Prometheus series (the statistics pipeline reads them);
- ``export.py``: a sentence-transformers folder exported to the ONNX file served.

The encoder's own steps (tokenizer, pooling, normalizing, cross-encoder scores) are a preprocessor:
preprocess/encoder.py, with preprocess/pooling.py and preprocess/sentence_folder.py; the CLI's side is
serving/cli/encoder_folder.py.
"""

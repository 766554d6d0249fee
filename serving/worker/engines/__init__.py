"""Model engines a worker forwards tensors to: Triton over gRPC, or onnxruntime in-process."""

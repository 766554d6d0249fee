"""MLServer echo: a custom runtime whose ``predict`` returns its inputs as outputs.

Served on MLServer's standard path, ``POST /v2/models/echo/infer`` (Open Inference Protocol
JSON, one BYTES input ``text``): ``mlserver start`` in this folder (model-settings.json,
settings.json), with the MLServer virtual environment.
"""
from mlserver import MLModel
from mlserver.types import InferenceRequest, InferenceResponse, ResponseOutput


class EchoRuntime(MLModel):
    async def load(self) -> bool:
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        outputs = [ResponseOutput(name=i.name, shape=i.shape, datatype=i.datatype, data=i.data)
                   for i in payload.inputs]
        return InferenceResponse(model_name=self.name, outputs=outputs)

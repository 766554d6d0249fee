"""BentoML echo: ``POST /echo`` with ``{"text": ...}`` answers ``{"text": ...}``.

Run with the BentoML virtual environment: ``bentoml serve bentoml_echo:Echo --port PORT``
(BentoML's defaults: one API server process, the service in it).
"""
import bentoml


@bentoml.service
class Echo:
    @bentoml.api
    def echo(self, text: str) -> dict:
        return {"text": text}

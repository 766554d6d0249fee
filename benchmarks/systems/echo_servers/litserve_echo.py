"""LitServe echo: ``POST /predict`` with ``{"text": ...}`` answers the same JSON.

Run with the LitServe virtual environment's Python: ``python litserve_echo.py PORT``.
LitServe's defaults: one inference worker process beside its uvicorn API server.
"""
import sys

import litserve as ls


class EchoAPI(ls.LitAPI):
    def setup(self, device):
        pass

    def decode_request(self, request):
        return request

    def predict(self, x):
        return x

    def encode_response(self, output):
        return output


if __name__ == "__main__":
    ls.LitServer(EchoAPI(), accelerator="cpu").run(port=int(sys.argv[1]), generate_client_file=False)

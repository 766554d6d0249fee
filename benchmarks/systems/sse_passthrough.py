"""The Python ceiling of relaying a stream: aiohttp in, Starlette's streaming response out, nothing else.

``python -m benchmarks.systems.sse_passthrough --upstream URL --port P`` forwards ``POST
/v1/completions`` and ``/v1/chat/completions`` to ``URL`` and passes the response's bytes on as they are
read, whatever arrived in one write (``iter_any``, as the worker reads an engine): no parsing, no
routing, no statistics. It runs under uvicorn with uvloop and httptools, as the
worker does, so the difference between the two is the worker's own work (benchmarks/llm_relay_rate.py).
"""
from __future__ import annotations

import argparse

import aiohttp
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route


def create_app(upstream: str) -> Starlette:
    state: dict[str, aiohttp.ClientSession] = {}

    async def forward(request: Request) -> Response:
        session = state.get("session")
        if session is None:
            session = state["session"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        body = await request.body()
        answer = await session.post(upstream + request.url.path, data=body,
                                    headers={"Content-Type": "application/json"})

        async def chunks():
            try:
                async for data in answer.content.iter_any():  # what arrived, in one write
                    yield data
            finally:
                answer.release()
        return StreamingResponse(chunks(), status_code=answer.status,
                                 media_type=answer.headers.get("Content-Type", "text/event-stream"))

    return Starlette(routes=[Route("/v1/completions", forward, methods=["POST"]),
                             Route("/v1/chat/completions", forward, methods=["POST"])])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--upstream", required=True, help="the engine's root URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    uvicorn.run(create_app(args.upstream.rstrip("/")), host="127.0.0.1", port=args.port, loop="uvloop",
                http="httptools", log_level="warning", access_log=False)


if __name__ == "__main__":
    main()

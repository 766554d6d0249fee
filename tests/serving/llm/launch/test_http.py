"""The launcher's HTTP face (serving/llm/launch/http.py) on a real socket: ``POST /engines/wake`` takes one engine
key and answers the launcher's own word; a body it cannot read is a 400 naming the shape, an engine it cannot
wake a 404, a launcher that has no wake at all (one machine) a 404 too. The launcher's ``wake`` is a stand-in
function here; the real one is tested in tests/serving/llm/kube/test_scale_to_zero.py and on the cluster."""
from __future__ import annotations

import httpx

from serving.llm.launch.http import EnginesServer


def test_the_wake_route_answers_202_400_and_404_in_json():
    woken: list[str] = []

    def wake(key: str) -> dict | None:
        woken.append(key)
        return {"engine": key, "state": "starting"} if key == "chat:1" else None

    server = EnginesServer(lambda: {"engines": {}}, "127.0.0.1", 0, wake=wake).start()
    plain = EnginesServer(lambda: {"engines": {}}, "127.0.0.1", 0).start()
    try:
        url = f"http://127.0.0.1:{server.port}/engines/wake"
        r = httpx.post(url, json={"engine": "chat:1"})
        assert r.status_code == 202 and r.json() == {"engine": "chat:1", "state": "starting"}
        r = httpx.post(url, json={"engine": "other:1"})
        assert r.status_code == 404 and "other:1" in r.json()["detail"]
        for bad in (b"not json", b'{"engine": 1}', b"[]", b""):
            r = httpx.post(url, content=bad, headers={"Content-Type": "application/json"})
            assert r.status_code == 400 and '{"engine": "<engine key>"}' in r.json()["detail"], (bad, r.text)
        assert woken == ["chat:1", "other:1"]
        r = httpx.post(f"http://127.0.0.1:{plain.port}/engines/wake", json={"engine": "chat:1"})
        assert r.status_code == 404 and "can be woken" in r.json()["detail"]
        assert httpx.post(f"http://127.0.0.1:{server.port}/engines").status_code == 404
    finally:
        server.close()
        plain.close()

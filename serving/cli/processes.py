"""Commands that run the platform's processes: each component alone, or all with `up`."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import httpx
import typer
from rich.console import Console

from serving.settings import (
    ControlPlaneSettings, LLMSettings, StatisticsSettings, TritonSettings, TritonSidecarSettings, WorkerSettings,
    default_home,
)
from serving.cli.readiness import state_text
from serving.supervisor import Child, Supervisor

console = Console()


def control_plane() -> None:
    """Run the registry and control plane (HTTP API + config stream), and TorchServe's management API on
    its own port (SERVING_TORCHSERVE_MANAGEMENT_PORT; 0: off) in the same process and event loop."""
    import uvicorn

    from registry.api import create_app
    from registry.torchserve_api import create_management_app
    from serving.asgi_servers import run_servers
    from serving.worker.listeners import ensure_free

    settings = ControlPlaneSettings()
    host, ts_port = settings.control_plane_host, settings.torchserve_management_port
    if ts_port:  # said before anything starts, naming the setting, rather than uvicorn's bind error later
        ensure_free(host, ts_port, "SERVING_TORCHSERVE_MANAGEMENT_PORT (0 turns TorchServe's management API off)")
    app = create_app(settings)
    configs = [uvicorn.Config(app, host=host, port=settings.control_plane_port, log_level="warning",
                              timeout_graceful_shutdown=2)]
    if ts_port:
        configs.append(uvicorn.Config(create_management_app(app, settings), host=host, port=ts_port,
                                      lifespan="off", log_level="warning", timeout_graceful_shutdown=2))
    if settings.metrics_api_port or settings.signals_port:  # the signals for HPAs or KEDA (registry/autoscaling/)
        from registry.autoscaling.serve import autoscaling_configs

        configs += autoscaling_configs(settings)
    run_servers(configs)


def worker(workers: int = typer.Option(1, help="worker processes sharing the port")) -> None:
    """Run FastAPI workers (/serve and the v2 protocol) following the control plane."""
    from serving.worker.main import run_worker

    run_worker(WorkerSettings(), workers)


def triton() -> None:
    """Run an embedded real Triton (tritonserver, models in its Python backend) serving the registry's ONNX models."""
    from serving.triton.embedded import run_embedded_triton

    run_embedded_triton(TritonSettings())


def triton_sidecar() -> None:
    """Load one Triton pod's models into the tritonserver beside it (NVIDIA's image; docs/deploy-helm.md)."""
    from serving.triton.sidecar import run_sidecar

    run_sidecar(TritonSidecarSettings())


def llm() -> None:
    """Run the LLM launcher: one vLLM OpenAI server per model version deployed with --engine vllm (supervised)."""
    from serving.llm.launch.main import run_launcher

    run_launcher(LLMSettings())


def statistics() -> None:
    """Run the statistics service: events in, Prometheus metrics and drift scores out."""
    from serving.statistics.service import run_statistics_service

    run_statistics_service(StatisticsSettings())


def stack_env(home: str, workers_port: int) -> dict[str, str]:
    """Environment every child of `up` shares, derived from the same settings they read."""
    env = {**os.environ, "SERVING_HOME": home}
    os.environ["SERVING_HOME"] = home
    cp, tr = ControlPlaneSettings(), TritonSettings()
    env["SERVING_CONTROL_PLANE_URL"] = f"http://{cp.control_plane_host}:{cp.control_plane_port}"
    env.setdefault("SERVING_TRITON_GRPC_URL", f"127.0.0.1:{tr.triton_grpc_port}")
    if tr.triton_memory_budget_mb > 0:  # only then does the embedded Triton listen for load requests
        env.setdefault("SERVING_TRITON_LOADER_URL", f"http://127.0.0.1:{tr.triton_loader_port}")
    env["SERVING_WORKER_PORT"] = str(workers_port)
    env.setdefault("SERVING_LLM_LAUNCHER_URL", f"http://127.0.0.1:{LLMSettings().llm_launcher_port}")
    return env


def up(
    workers: int = typer.Option(1, help="worker processes"),
    port: int = typer.Option(None, help="worker port (default SERVING_WORKER_PORT or 9090)"),
    grpc_port: int = typer.Option(None, help="workers' gRPC port (default SERVING_WORKER_GRPC_PORT or 9091; 0: off)"),
    home: Optional[str] = typer.Option(None, help="state directory (default SERVING_HOME or ~/.serving)"),
    with_triton: bool = typer.Option(True, "--triton/--no-triton", help="start the embedded Triton"),
    with_llm: bool = typer.Option(True, "--llm/--no-llm", help="start the LLM launcher (vLLM engines of "
                                                               "--engine vllm endpoints)"),
    prometheus: bool = typer.Option(False, "--prometheus/--no-prometheus",
                                    help="also start Prometheus (if installed) scraping statistics and Triton"),
    prometheus_port: int = typer.Option(9092, help="Prometheus web port (9090 and 9091: the workers' HTTP and gRPC)"),
) -> None:
    """Start control plane, statistics, embedded Triton, the LLM launcher and N workers, restart any that crashes;
    Ctrl-C stops them all.

    A child that exits is started again after a backoff (0.5 s doubling to 10 s); `up` gives up
    and stops everything only when one crashes 5 times within 60 s.
    """
    home = home or os.environ.get("SERVING_HOME") or str(default_home())
    port = port or WorkerSettings().worker_port
    env = stack_env(home, port)
    grpc_port = WorkerSettings().worker_grpc_port if grpc_port is None else grpc_port
    env["SERVING_WORKER_GRPC_PORT"] = str(grpc_port)
    st, tr = StatisticsSettings(), TritonSettings()
    sup = Supervisor(env, log_dir=default_log_dir(home))
    try:
        sup.start(Child("control-plane", ["control-plane"], f"{env['SERVING_CONTROL_PLANE_URL']}/health"))
        sup.start(Child("statistics", ["statistics"], f"http://127.0.0.1:{st.statistics_port}/health"))
        if with_triton:
            sup.start(Child("triton", ["triton"], f"http://127.0.0.1:{tr.triton_http_port}/v2/health/live"), 120)
        if with_llm:
            sup.start(Child("llm", ["llm"], f"http://127.0.0.1:{LLMSettings().llm_launcher_port}/health"))
        sup.start(Child("worker", ["worker", "--workers", str(workers)], f"http://127.0.0.1:{port}/v2/health/live"))
        if prometheus:
            _start_prometheus(sup, home, st, tr if with_triton else None, prometheus_port, with_llm)
        console.print(f"[bold green]serving is up[/bold green]: control plane {env['SERVING_CONTROL_PLANE_URL']}"
                      f"{_torchserve_management()}, workers http://127.0.0.1:{port}"
                      f"{f' and gRPC 127.0.0.1:{grpc_port}' if grpc_port else ''}, logs in {sup.log_dir}")
        if not os.environ.get("SERVING_ADMIN_TOKEN"):
            console.print(f"admin token: {home}/tokens/admin (mode 0600; the CLI finds it there for a local "
                          f"control plane with SERVING_HOME={home}), worker token: {home}/tokens/worker")
        code = sup.wait()
    except RuntimeError as exc:
        console.print(f"[red]{exc}[/red]")
        code = 1
    finally:
        sup.stop_all()
    raise typer.Exit(code)


def _torchserve_management() -> str:
    """Where the control plane serves TorchServe's management API, as `up` lists the addresses."""
    cp = ControlPlaneSettings()
    if not cp.torchserve_management_port:
        return ""
    return f" (TorchServe management API http://{cp.control_plane_host}:{cp.torchserve_management_port})"


def _start_prometheus(sup: Supervisor, home: str, st: StatisticsSettings, tr: TritonSettings | None,
                      port: int, with_llm: bool = False) -> None:
    """Prometheus is optional: when it is missing or fails, say so and keep the stack up."""
    from pathlib import Path

    from serving.statistics.prometheus_config import start_prometheus

    workdir = Path(home) / "prometheus"
    workdir.mkdir(parents=True, exist_ok=True)
    triton = [f"127.0.0.1:{tr.triton_metrics_port}"] if tr else []
    llm = [f"127.0.0.1:{LLMSettings().llm_launcher_port}"] if with_llm else []

    def spawn():
        return start_prometheus(workdir, [f"127.0.0.1:{st.statistics_port}"], f"127.0.0.1:{port}", triton,
                                llm_targets=llm)

    try:
        proc = spawn()
    except (FileNotFoundError, RuntimeError) as exc:
        console.print(f"[yellow]not starting Prometheus: {exc}[/yellow]")
        return
    sup.children.append(Child("prometheus", [], None, proc, spawn=spawn))
    console.print(f"[green]started[/green] prometheus http://127.0.0.1:{port} (pid {proc.pid})")


def default_log_dir(home: str):
    from pathlib import Path

    return Path(home) / "logs"


def status(ctx: typer.Context,
           worker_url: str = typer.Option("http://127.0.0.1:9090", envvar="SERVING_WORKER_URL")) -> None:
    """Health of the control plane and a worker, and what is deployed."""
    cp = ctx.obj
    health = cp.get("/health")
    console.print(f"control plane {cp.url}: [green]{health['status']}[/green], config revision {health['revision']}")
    try:
        ws = httpx.get(f"{worker_url}/status", timeout=3.0).json()
        console.print(f"worker {worker_url}: revision {ws.get('revision')}, endpoints {ws.get('endpoints')}")
        _grpc_status(worker_url, ws.get("grpc_port"))
    except (httpx.HTTPError, ValueError) as exc:
        console.print(f"worker {worker_url}: [red]unreachable[/red] ({exc})")
    for ep in cp.get("/endpoints"):
        routes = ", ".join(f"{t['model']}:{t['version']}={t['weight']:g}%" for t in ep["targets"])
        console.print(f"  /serve/{ep['name']} ({ep['engine']}): {routes} [{state_text(ep.get('readiness'))}]")


def demo(workers: int = typer.Option(2, help="worker processes"),
         export: Optional[Path] = typer.Option(None, "--export", file_okay=False, metavar="DIR",
                                               help="only write the demo's model files into DIR (model.onnx, "
                                                    "model-v2.onnx, tokenizer/), as the README's Quick start uses them"),
         export_llm: Optional[Path] = typer.Option(None, "--export-llm", file_okay=False, metavar="DIR",
                                                   help="only write a tiny Llama (random weights, a tokenizer trained "
                                                        "here, a chat template) into DIR as a Hugging Face folder, as "
                                                        "the README's LLM quick start uploads it")) -> None:
    """The main job: build a real model, start the stack, deploy, query, canary, stop."""
    from serving.demo import export_llm as write_llm, run

    if export_llm is not None:
        write_llm(export_llm)
        return
    run(workers, export)


def _grpc_status(worker_url: str, port: int | None) -> None:
    """The worker's gRPC port (from its /status) and whether it answers ServerLive there."""
    if not port:
        console.print("worker gRPC: off (SERVING_WORKER_GRPC_PORT=0)")
        return
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    target = f"{httpx.URL(worker_url).host}:{port}"
    try:
        client = grpcclient.InferenceServerClient(target)
        live = client.is_server_live(client_timeout=3.0)
        client.close()
    except InferenceServerException as exc:
        console.print(f"worker gRPC {target}: [red]unreachable[/red] ({exc.message()})")
        return
    console.print(f"worker gRPC {target}: {'live' if live else '[red]not live[/red]'}")

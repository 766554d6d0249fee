"""Entry point of the `serving` command."""
from __future__ import annotations

import typer

from serving.cli import keys, processes, tokens
from serving.cli.client import ControlPlane
from serving.cli.endpoints import canary_app, endpoint_app, metrics_app
from serving.cli.log import log_app
from serving.cli.models import app as model_app
from serving.cli.rollouts import app as rollout_app

app = typer.Typer(help="Serve ONNX models behind Triton: registry, canaries, workers, statistics.",
                  no_args_is_help=True, pretty_exceptions_enable=False)


@app.callback()
def main(
    ctx: typer.Context,
    control_plane: str = typer.Option(None, "--control-plane", envvar="SERVING_CONTROL_PLANE_URL",
                                      help="control plane URL [default: the one of `serving login`, "
                                           "else http://127.0.0.1:8080]"),
) -> None:
    from serving.credentials import read_credentials

    ctx.obj = ControlPlane(control_plane or read_credentials().get("control_plane") or "http://127.0.0.1:8080")


app.add_typer(model_app, name="model")
app.add_typer(endpoint_app, name="endpoint")
app.add_typer(canary_app, name="canary")
app.add_typer(metrics_app, name="metrics")
app.add_typer(tokens.token_app, name="token")
app.add_typer(keys.key_app, name="key")
app.command()(tokens.login)
app.command()(tokens.audit)
app.add_typer(rollout_app, name="rollout")
app.add_typer(log_app, name="log")
for command in (processes.up, processes.demo, processes.status, processes.worker, processes.triton, processes.llm,
                processes.statistics):
    app.command()(command)
app.command("control-plane")(processes.control_plane)
app.command("triton-sidecar")(processes.triton_sidecar)


def run() -> None:
    """The ``serving`` entry point: ClearML Serving's multi-value flags are accepted as typed."""
    import sys

    from serving.cli.clearml_flags import expand_variadic

    sys.argv[1:] = expand_variadic(sys.argv[1:])
    app()


if __name__ == "__main__":
    run()

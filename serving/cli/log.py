"""`serving log export`: a dataset out of the prediction log (docs/prediction-log.md), from the local
files of the embedded stack or from the Kafka topic of compose and Helm, with a progress bar."""
from __future__ import annotations

import importlib.util
import re
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

import typer
from rich.progress import BarColumn, DownloadColumn, MofNCompleteColumn, Progress, TextColumn

from serving.cli.client import err
from serving.cli.output import console

log_app = typer.Typer(help="The prediction log: datasets out of it.", no_args_is_help=True)

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")


def parse_when(text: Optional[str], option: str, now: float) -> Optional[float]:
    """``7d`` (s, m, h, d, w: that long ago) or an ISO date or time (UTC when it names no zone)."""
    if text is None:
        return None
    found = DURATION.match(text.strip())
    if found:
        return now - float(found[1]) * UNITS[found[2]]
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise typer.BadParameter(f"{text!r} is neither a duration such as 7d, 12h or 30m nor a date such as "
                                 "2026-11-01 or 2026-11-01T12:00", param_hint=option) from None
    return (when if when.tzinfo else when.replace(tzinfo=timezone.utc)).timestamp()


@log_app.command("export")
def export(
    endpoint: str = typer.Option(..., "--endpoint"),
    out: Path = typer.Option(..., "--out", "-o", help="the file to write"),
    fmt: str = typer.Option("parquet", "--format", help="parquet | jsonl | openai-chat (LLM endpoints: "
                                                        "OpenAI's fine-tuning chat format)"),
    since: Optional[str] = typer.Option(None, help="from this long ago (7d, 12h) or this date; default: all"),
    until: Optional[str] = typer.Option(None, help="up to (not including) this long ago or this date"),
    version: Optional[int] = typer.Option(None, help="only this version's requests"),
    with_feedback: bool = typer.Option(False, "--with-feedback", help="join each request's ground truth"),
    shadow: bool = typer.Option(False, "--shadow", help="also the shadow copies' answers (column shadow)"),
    folder: Optional[Path] = typer.Option(None, "--dir", help="the files sink's folder (default: "
                                                              "SERVING_PREDICTION_LOG_DIR)"),
    kafka: Optional[str] = typer.Option(None, "--kafka", help="read the Kafka topic at these bootstrap servers "
                                                              "instead (default with SERVING_PREDICTION_LOG_SINK=kafka)"),
    topic: Optional[str] = typer.Option(None, help="the Kafka topic (default: SERVING_PREDICTION_LOG_TOPIC)"),
) -> None:
    """Write one row per logged request of an endpoint: parquet or JSON Lines that pandas and Hugging Face
    datasets open as they are."""
    from serving.prediction_log import export as exporting, sources
    from serving.settings import WorkerSettings

    if fmt not in exporting.FORMATS:
        raise typer.BadParameter(f"{fmt!r}: one of {', '.join(exporting.FORMATS)}", param_hint="--format")
    now = time.time()
    start, end = parse_when(since, "--since", now), parse_when(until, "--until", now)
    if start is not None and end is not None and start >= end:
        raise typer.BadParameter(f"the range is empty: --since {since} is not before --until {until}",
                                 param_hint="--since")
    settings = WorkerSettings()
    kafka = kafka or (settings.kafka_bootstrap_servers if settings.prediction_log_sink == "kafka" and not folder else None)
    selection = exporting.Selection(endpoint, start, end, version, shadow)
    passes = 2 if with_feedback else 1
    columns = [TextColumn("{task.description}"), BarColumn()]
    with Progress(*columns, DownloadColumn() if not kafka else MofNCompleteColumn(), console=err,
                  transient=True) as progress:
        if kafka:
            topic = topic or settings.prediction_log_topic
            task = progress.add_task(f"reading {topic}", total=sources.kafka_size(kafka, topic) * passes)
            source = lambda: sources.kafka_records(kafka, topic, lambda n: progress.advance(task, n))  # noqa: E731
        else:
            where = folder or settings.resolved_prediction_log_dir()
            if not where.is_dir():
                raise typer.BadParameter(f"{where} is not a folder of prediction-log files", param_hint="--dir")
            task = progress.add_task(f"reading {where}", total=sources.files_size(where) * passes)
            source = lambda: sources.file_records(where, lambda n: progress.advance(task, n))  # noqa: E731
        if fmt == "parquet" and importlib.util.find_spec("pyarrow") is None:  # refused before reading anything
            raise typer.BadParameter("parquet needs pyarrow: pip install 'serving[export]'", param_hint="--format")
        n = exporting.write(exporting.rows(source, selection, with_feedback), out, fmt)
    console.print(f"wrote {n} row(s) of endpoint {endpoint} to {out} ({fmt})")

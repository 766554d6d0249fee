"""Datasets out of the prediction log (serving/prediction_log/export.py, `serving log export`): one row
per request in the selection, Kafka's duplicates written once, feedback joined; the files open in pandas
and Hugging Face datasets as they are, with the rows the log holds; OpenAI's fine-tuning chat format for
LLM answers; bad ranges and formats are refused with a clear message."""
from __future__ import annotations

import json
import uuid

import orjson
import pytest
from typer.testing import CliRunner

from serving.cli.main import app
from serving.prediction_log.export import Selection, rows, write
from serving.prediction_log.sinks.files import RotatingFiles
from serving.prediction_log.sinks.kafka import KafkaRecords
from tests.serving.statistics.kafka_broker import kafka_broker

runner = CliRunner()
T0 = 1_790_000_000.0


def record(i: int, **kw) -> dict:
    return {"request_id": f"r{i}", "ts": T0 + i, "endpoint": "clf", "version": 1 + i % 2, "status": 200,
            "latency_s": 0.01, "shadow": False, "inputs": {"text": f"text {i}"}, "outputs": {"label": "POS"}, **kw}


def logged() -> list[dict]:
    out = [record(i) for i in range(10)]
    out.append(record(3))  # the Kafka sink delivered r3 twice
    out.append(record(4, shadow=True, version=3, outputs={"label": "NEG"}))  # a shadow's answer to r4
    out.append({**record(11), "endpoint": "other"})
    out += [{"kind": "feedback", "endpoint": "clf", "request_id": f"r{i}", "label": "POS" if i % 2 else "NEG",
             "ts": T0 + 100} for i in (1, 2, 5)]
    return out


def test_selection_duplicates_shadow_and_feedback():
    got = list(rows(lambda: logged(), Selection("clf"), with_feedback=True))
    assert [r["request_id"] for r in got] == [f"r{i}" for i in range(10)], "each request once, live only"
    assert {r["request_id"]: r["feedback_label"] for r in got if r["feedback_label"]} == {"r1": "POS", "r2": "NEG",
                                                                                          "r5": "POS"}
    assert json.loads(got[0]["inputs"]) == {"text": "text 0"} and json.loads(got[0]["outputs"]) == {"label": "POS"}
    shadows = list(rows(lambda: logged(), Selection("clf", shadow=True)))
    assert [(r["request_id"], r["shadow"]) for r in shadows if r["request_id"] == "r4"] == [("r4", False), ("r4", True)]
    window = list(rows(lambda: logged(), Selection("clf", since=T0 + 2, until=T0 + 6, version=1)))
    assert [r["request_id"] for r in window] == ["r2", "r4"]


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_pandas_and_datasets_open_the_file_as_it_is(tmp_path, fmt):
    import datasets
    import pandas as pd

    path = tmp_path / f"clf.{fmt}"
    assert write(rows(lambda: logged(), Selection("clf"), with_feedback=True), path, fmt) == 10
    frame = pd.read_parquet(path) if fmt == "parquet" else pd.read_json(path, lines=True)
    assert len(frame) == 10 and list(frame["request_id"]) == [f"r{i}" for i in range(10)]
    assert frame["feedback_label"].notna().sum() == 3
    loaded = datasets.load_dataset("parquet" if fmt == "parquet" else "json", data_files=str(path),
                                   split="train", cache_dir=str(tmp_path / "hf-cache"))
    assert loaded.num_rows == 10 and json.loads(loaded[2]["inputs"]) == {"text": "text 2"}


def test_openai_chat_format_of_llm_answers(tmp_path):
    llm = [{"request_id": "a", "ts": T0, "endpoint": "chat", "version": 1, "status": 200, "shadow": False,
            "inputs": {"messages": [{"role": "user", "content": "hi"}], "temperature": 0},
            "outputs": {"choices": [{"index": 0, "text": "hello"}]}, "usage": {"prompt_tokens": 3, "completion_tokens": 1}},
           {"request_id": "b", "ts": T0, "endpoint": "chat", "version": 1, "status": 200, "shadow": False,
            "inputs": {"prompt": "say"}, "outputs": {"choices": [{"index": 0, "text": " it"}]}},
           {"request_id": "c", "ts": T0, "endpoint": "chat", "version": 1, "status": 400, "shadow": False,
            "inputs": {"prompt": "x"}, "error": "too long"}]
    path = tmp_path / "chat.jsonl"
    assert write(rows(lambda: llm, Selection("chat")), path, "openai-chat") == 2
    assert [orjson.loads(line) for line in path.read_bytes().splitlines()] == [
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]},
        {"messages": [{"role": "user", "content": "say"}, {"role": "assistant", "content": " it"}]}]


def test_the_cli_reads_the_files_sink_and_the_kafka_topic_alike(tmp_path):
    import pandas as pd

    files = RotatingFiles(tmp_path / "predictions", "w:1", max_bytes=2000)
    for i in range(0, len(logged()), 4):  # batches, as the writer hands them over
        files.write(logged()[i:i + 4])
    files.close()
    assert len(files.files()) > 1, "several files, read in order"
    out = tmp_path / "from-files.parquet"
    res = runner.invoke(app, ["log", "export", "--endpoint", "clf", "--dir", str(tmp_path / "predictions"),
                              "--with-feedback", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "wrote 10 row(s) of endpoint clf" in res.output
    topic = f"predictions-{uuid.uuid4().hex[:8]}"
    with kafka_broker(tmp_path) as bootstrap:
        sink = KafkaRecords(bootstrap, topic)
        sink.write(logged())
        sink.close()
        from_kafka = tmp_path / "from-kafka.parquet"
        res = runner.invoke(app, ["log", "export", "--endpoint", "clf", "--kafka", bootstrap, "--topic", topic,
                                  "--with-feedback", "--out", str(from_kafka)])
    assert res.exit_code == 0, res.output
    a, b = pd.read_parquet(out), pd.read_parquet(from_kafka)
    assert sorted(a["request_id"]) == sorted(b["request_id"]) and len(b) == 10
    assert b["feedback_label"].notna().sum() == 3


@pytest.mark.parametrize("args,words", [
    (["--since", "7x"], "neither a duration such as 7d"),
    (["--since", "1d", "--until", "2d"], "the range is empty"),
    (["--format", "csv"], "one of parquet, jsonl, openai-chat"),
    (["--dir", "/no/such/folder"], "is not a folder of prediction-log files"),
])
def test_bad_ranges_and_formats_are_refused_in_words(tmp_path, args, words):
    (tmp_path / "p").mkdir()
    res = runner.invoke(app, ["log", "export", "--endpoint", "clf", "--dir", str(tmp_path / "p"),
                              "--out", str(tmp_path / "x"), *args])
    assert res.exit_code == 2 and words in " ".join(res.output.replace("│", " ").split()), res.output
    assert not (tmp_path / "x").exists()

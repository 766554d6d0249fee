"""The prediction log: what each sampled request asked and what it was answered, kept for audit and
for training the next version (docs/prediction-log.md).

- policy.py: an endpoint's log settings from the config snapshot (sample, fields, redaction) and the
  one sampling decision per request, from its request id, so a live record and its shadow's agree;
- record.py: one record from a finished request, inputs summarized past a size cap, redacted;
- writer.py: the bounded queue between requests and the sink, its counters, its background thread;
- sinks/: where records go: rotating JSON Lines files (the embedded default) or Kafka.
"""

"""The latency bench's model of AWS's scheduler and Lambda (bench/lambda_model.py)
and how its results are kept (bench/report.py), without servers."""

from __future__ import annotations

import json
import os
import queue
import random
import time

import pytest

from bench import report
from bench.lambda_model import (
    FUNCTION_NAME,
    CpuCapError,
    InvokeApi,
    LambdaCpu,
    LocalLambda,
    SchedulerModel,
    aws_environment,
    cpu_share,
    plan_slots,
    template_function_memory_mb,
    uncovered,
)


def test_a_punctual_schedule_starts_every_slot_on_its_second():
    model = SchedulerModel(period=60)
    slots = plan_slots(model, random.Random(1), measured_for=600, horizon=700)
    assert [s.start for s in slots] == [s.at for s in slots] == [60.0 * k for k in range(12)]
    assert not any(s.missed for s in slots) and model.punctual and model.key == "punctual"


def test_jitter_and_missed_runs_of_the_scheduler_model():
    model = SchedulerModel(period=60, start_jitter=60, missed_runs=0.1, cold_start=1)
    slots = plan_slots(model, random.Random(7), measured_for=600, horizon=600)
    by_index = {s.index: s for s in slots}
    assert all(s.at <= s.start < s.at + 60 for s in slots)
    assert [s.start for s in slots] == sorted(s.start for s in slots)
    assert not by_index[0].missed
    # exactly a tenth of the slots within the measured time after the first
    assert sum(1 for s in slots if s.missed and 0 < s.index and s.at < by_index[0].start + 600) == 1
    assert model.key == "jitter 60 s, missed 0.1, cold start 1 s"
    assert model.label() == ("a slot every 60 s, starts uniform within 60 s after their slot, 10% of the runs "
                             "missed, 1 s cold starts")


def test_uncovered_time_of_a_union_of_intervals():
    assert uncovered([(0, 2), (1, 3), (5, 6)], 0, 10) == (6, 4, 2)
    assert uncovered([(-5, 4), (3.5, 20)], 0, 10) == (0, 0.0, 0)
    assert uncovered([], 0, 10) == (10, 10, 1)


def test_invokes_beyond_the_reserved_concurrency_are_throttled_retried_and_dropped():
    commands = [queue.Queue() for _ in range(4)]
    lam = LocalLambda(commands, timeout=10, cold_start=0, reserved=2, max_event_age=2.5)
    try:
        first, second, third = (lam.invoke_async({}, "schedule", k) for k in range(3))
        assert (first.container, second.container, third.container) == (0, 1, None)
        assert third.throttles == 1 and not third.dropped
        lam.on_message({"kind": "end", "id": first.id, "at": time.time()})
        time.sleep(1.3)  # the retry after 1 s finds a free container
        assert third.container in (0, 2, 3) and third.requested_at is not None
        assert sum(q.qsize() for q in commands) == 3
        fourth = lam.invoke_async({}, "self-invoke")
        time.sleep(1.3)  # throttled at once and after 1 s; the next retry would be older than 2.5 s
        assert fourth.throttles == 2 and fourth.dropped and fourth.container is None
    finally:
        lam.close()


def test_the_invoke_api_stand_in_accepts_only_an_asynchronous_invoke_of_the_function(monkeypatch):
    import boto3
    from botocore.exceptions import ClientError

    got, refused = [], []
    api = InvokeApi(got.append, lambda: refused.append(1))
    try:
        for name, value in aws_environment(api.url).items():
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, value)
        client = boto3.client("lambda", region_name=os.environ["AWS_REGION"])
        event = {"source": "outbox.handover", "channel": "redis", "predecessor": "abc"}
        answer = client.invoke(FunctionName=FUNCTION_NAME, InvocationType="Event", Payload=json.dumps(event))
        assert answer["StatusCode"] == 202 and answer["Payload"].read() == b"" and got == [event]
        for kwargs in ({"FunctionName": FUNCTION_NAME, "InvocationType": "RequestResponse"},
                       {"FunctionName": "another-function", "InvocationType": "Event"}):
            with pytest.raises(ClientError) as err:
                client.invoke(Payload=b"{}", **kwargs)
            assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
        assert got == [event] and len(refused) == 2
    finally:
        api.close()


def _entry(key: str, started_at: str) -> dict:
    return {"model": {"key": key}, "label": key, "started_at": started_at, "runs": []}


def test_a_latency_run_replaces_only_its_own_scheduler_models_figures():
    old = {"models": {"punctual": _entry("punctual", "a"), "jitter 60 s, missed 0.1, cold start 1 s":
                      _entry("jitter 60 s, missed 0.1, cold start 1 s", "a")}, "idle": {"polls": 1}}
    new = {"models": {"punctual": _entry("punctual", "b")}, "idle": {"polls": 2}}
    merged = report.merge_latency(old, new)
    assert {k: e["started_at"] for k, e in merged["models"].items()} == {
        "punctual": "b", "jitter 60 s, missed 0.1, cold start 1 s": "a"}
    assert merged["idle"] == {"polls": 2}
    # the README's table quotes the model of AWS's scheduler when there is one
    assert report._modes_entry(merged)["model"]["key"] == "jitter 60 s, missed 0.1, cold start 1 s"


def test_a_latency_section_from_before_the_registry_reads_as_the_punctual_model():
    legacy = {"period_seconds": 30.0, "timeout_seconds": 40.0, "margin_seconds": 5.0, "overlap_seconds": 5.0,
              "batch_size": 1000, "runs": [{"offered_per_second": 100, "seconds": 130.0, "sent": 13000,
                                            "delivered_per_second": 100.0, "sustained": True,
                                            "lag_ms": {"p50": 1.0, "p99": 2.0, "max": 3.0}}]}
    (entry,) = report.latency_models(legacy)
    assert entry["model"]["key"] == "punctual" and entry["before_registry"]
    cells = report._latency_cells(entry["runs"][0])
    assert len(cells) == len(report.LATENCY_COLUMNS) and cells[1] == "100.0" and cells[6] == "–"
    new = {"models": {"jitter 60 s, missed 0.1, cold start 1 s": _entry("jitter 60 s, missed 0.1, cold start 1 s",
                                                                        "b")}}
    assert set(report.merge_latency(legacy, new)["models"]) == {"punctual", "jitter 60 s, missed 0.1, cold start 1 s"}


def test_lambdas_cpu_share_is_memory_over_1769_mb_at_most_the_machines_cores():
    assert round(cpu_share(512), 3) == 0.289
    assert cpu_share(1769) == 1.0
    assert round(cpu_share(4096, cores=8), 3) == 2.315
    assert cpu_share(4096, cores=2) == 2
    assert cpu_share(4096) == min(4096 / 1769, os.cpu_count())
    held = LambdaCpu(1024, capped=False)
    assert held.quota_us == 57_886 and held.record() == {
        "function_memory_mb": 1024, "share": 0.579, "capped": False,
        "label": "uncapped (not held to Lambda's CPU at 1,024 MB (0.58 of a core))"}


def test_the_default_memory_is_the_templates_function_memory():
    from support.template import TemplateModel

    parameters = TemplateModel(every_condition=True).doc["Parameters"]
    assert template_function_memory_mb() == parameters["FunctionMemoryMB"]["Default"]


def test_without_a_writable_cgroup_the_bench_refuses_in_one_line(tmp_path):
    with pytest.raises(CpuCapError) as refused:
        LambdaCpu(512, root=tmp_path / "no-cpu-controller")
    assert "\n" not in str(refused.value) and "--uncapped" in str(refused.value)


@pytest.mark.parametrize("value", ["64", "512,512", "twelve", "20000"])
def test_a_function_memory_outside_the_templates_bounds_is_refused_naming_the_option(tmp_path, value):
    from click.testing import CliRunner

    from bench.cli import main

    out = tmp_path / "latest.json"
    got = CliRunner().invoke(main, ["drain", "--function-memory-mb", value, "--out", str(out)])
    assert got.exit_code == 2 and "--function-memory-mb" in got.output and "Traceback" not in got.output
    assert not out.exists()


def test_a_memory_sweep_renders_how_drain_grows_with_memory():
    def section(mb: float, one: float, two: float, cold: float) -> dict:
        cpu = LambdaCpu(mb, capped=False).record() | {"capped": True, "label": f"held at {mb}"}
        runs = [{"batch_size": 100, "messages_per_second": one / 2, "cold_start_seconds": cold + 1},
                {"batch_size": 1000, "messages_per_second": one, "cold_start_seconds": cold}]
        return report.sweep_entry({"limit": {"runs": [{"processes": 1, "messages_per_second": 2 * one},
                                                      {"processes": 2, "messages_per_second": 3 * one}]},
                                   "drain": {"runs": runs, "two_invocations": {"messages_per_second": two,
                                                                               "cold_start_seconds": cold},
                                             "cpu": cpu}}, cpu)

    results = {"memory_sweep": {"run": "2026-01-01T00:00:00+00:00", "command": "python -m bench drain",
                                "memories": [section(512, 1000, 1500, 4.0), section(1769, 3000, 4000, 1.5)]}}
    lines = report.memory_sweep_lines(results)
    assert lines[4] == "| 512 MB | 0.29 | 2,000 | 1,000 | 0.50× | 1,500 | 0.50× | 1.50× | 4.00 | – |"
    assert lines[5] == "| 1,769 MB | 1.00 | 6,000 | 3,000 | 0.50× | 4,000 | 0.44× | 1.33× | 1.50 | – |"
    assert report.memory_growth(results) == (
        "Held to Lambda's CPU at each memory, one drain-mode invocation delivers 1,000 msg/s at 512 MB (0.29 of "
        "a core; cold start 4.0 s), 3,000 msg/s at 1,769 MB (1.00 of a core; cold start 1.5 s) "
        "(run 2026-01-01T00:00:00+00:00).")

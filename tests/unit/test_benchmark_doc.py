"""docs/benchmark.md is what the bench writes from its results file: no figure
in it is typed by hand."""

from __future__ import annotations

import json

from bench import report


def test_the_benchmark_page_is_the_bench_rendering_of_the_results_file() -> None:
    results = json.loads(report.LATEST.read_text(encoding="utf-8"))
    assert report.DOCS.read_text(encoding="utf-8") == report.docs(results), \
        "docs/benchmark.md differs from its results file: run `python -m bench docs`"


def test_the_readme_modes_table_is_the_bench_rendering_too() -> None:
    results = json.loads(report.LATEST.read_text(encoding="utf-8"))
    readme = report.README.read_text(encoding="utf-8")
    assert report.MODES_BEGIN in readme and report.MODES_END in readme
    assert report.readme_with_modes(readme, results) == readme, \
        "README's modes table differs from the results file: run `python -m bench docs`"


def test_the_ordering_cost_in_the_channels_page_is_the_bench_rendering_too() -> None:
    results = json.loads(report.LATEST.read_text(encoding="utf-8"))
    channels = report.CHANNELS.read_text(encoding="utf-8")
    assert report.ORDERING_BEGIN in channels and report.ORDERING_END in channels
    assert report._with_block(channels, report.ORDERING_BEGIN, report.ORDERING_END,
                              report.ordering_summary(results)) == channels, \
        "docs/channels.md's ordering figures differ from the results file: run `python -m bench docs`"


def test_the_cost_columns_use_the_templates_defaults() -> None:
    from support.template import TemplateModel

    parameters = TemplateModel(every_condition=True).doc["Parameters"]
    assert parameters["RelayScheduleExpression"]["Default"] == f"rate({report.SCHEDULE_PERIOD_SECONDS // 60} minute)"
    assert parameters["FunctionMemoryMB"]["Default"] == report.FUNCTION_MEMORY_GB * 1024
    assert parameters["FunctionTimeoutSeconds"]["Default"] == report.FUNCTION_TIMEOUT_SECONDS
    assert parameters["BatchSize"]["Default"] == report.BATCH_SIZE
    assert parameters["PollIntervalSeconds"]["Default"] == report.POLL_INTERVAL_SECONDS
    from outbox_relay.config import Settings

    assert Settings.model_fields["deadline_margin_seconds"].default == report.DEADLINE_MARGIN_SECONDS

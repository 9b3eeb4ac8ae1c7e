"""docs/howto/add-a-channel.md names every place a channel appears: each
registered channel is found in each of them, no other file outside the channel
packages names every channel, the files a channel's author edits outside its
package are no more than the how-to says (decision 0061), and each channel's spec
is consistent with the code and the template it names."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from outbox_relay import observability as obs
from outbox_relay.publishers.registry import CHANNELS, Channel, spec_for
from outbox_relay.publishers.spec import _resolve
from support.template import TemplateModel

ROOT = Path(__file__).resolve().parents[2]
HOWTO = ROOT / "docs/howto/add-a-channel.md"
_ROW = re.compile(r"^\| `(?P<path>[^`]+)` \| [^|]+ \| (?P<kind>\w+) \| `(?P<needle>[^`]+)` \|$")
#: The most files outside its package a channel's author may have to edit (the issue's bar).
GOAL = 5


def _rows() -> list[re.Match[str]]:
    text = HOWTO.read_text(encoding="utf-8").split("## The files", 1)[1]
    return [m for m in map(_ROW.match, text.splitlines()) if m]


def _places() -> list[tuple[str, str]]:
    return [(m["path"], m["needle"]) for m in _rows()]


def _fill(text: str, spec) -> str:
    return text.format(channel=spec.name, Prefix=spec.template_prefix, producer=spec.producer)


def test_the_howto_lists_places() -> None:
    assert len(_places()) >= 10
    assert {m["kind"] for m in _rows()} == {"package", "edited", "generated", "docs"}


def test_a_channel_edits_no_more_files_outside_its_package_than_the_howto_states() -> None:
    # Given the figure the how-to states, and the files it marks as edited by hand
    stated = int(re.search(r"edits \*\*at most (\d+) files outside its package\*\*",
                           HOWTO.read_text(encoding="utf-8"))[1])
    edited = {m["path"] for m in _rows() if m["kind"] == "edited"}
    # Then none of them is in the package, and there are no more than it says, nor than the goal
    assert not any("publishers/{channel}/" in path for path in edited)
    assert len(edited) <= stated <= GOAL, f"a channel edits {len(edited)} files outside its package: {sorted(edited)}"


def _markers(spec) -> tuple[str, ...]:
    """What names one channel in a file: its producer function, relay function, package,
    spec, command, name as a literal, variables, `Channel` member."""
    return (spec.producer, f"Relay{spec.template_prefix}Function", f"publishers.{spec.name}",
            f"publishers/{spec.name}/", f"{spec.name}.SPEC", spec.enqueue_command, f'"{spec.name}"',
            f"'{spec.name}'", f"OUTBOX_{spec.name.upper()}_", f"Channel.{spec.name.upper()}")


#: Where a channel may be listed beside every other without being a place to add one:
#: the tests of behaviours every channel has, and the bench, which the how-to lists as
#: optional. The others are the code, templates, configuration and test support.
_SCANNED = ("shared", "tools", "functions", "infra", "events", "tests/support", "template.yaml",
            "samconfig.toml", "pyproject.toml")
_OPTIONAL = ("tools/outbox_tools/sam_local/bridges.py",)


def test_no_file_outside_the_packages_names_every_channel_unless_the_howto_lists_it() -> None:
    # Given the project's files outside the channel packages
    files = subprocess.run(["git", "ls-files", *_SCANNED], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    listed = {path.format(channel="", Prefix="", producer="") for path, _ in _places()} | set(_OPTIONAL)
    # When one names every registered channel (a hand-written list of the channels)
    everywhere = []
    for path in files:
        if any(f"publishers/{spec.name}/" in path for spec in CHANNELS) or not (ROOT / path).is_file():
            continue
        text = (ROOT / path).read_text(encoding="utf-8", errors="replace")
        if all(any(m in text for m in _markers(spec)) for spec in CHANNELS):
            everywhere.append(path)
    # Then the how-to lists it: a new channel would have to be added there too
    assert sorted(set(everywhere) - listed) == [], "list these in docs/howto/add-a-channel.md, or read the registry"
    assert everywhere, "the scan found not even the registry"


@pytest.mark.parametrize("spec", CHANNELS, ids=lambda s: s.name)
@pytest.mark.parametrize("place", _places(), ids=lambda p: f"{p[0]}:{p[1]}")
def test_every_registered_channel_appears_in_each_place_the_howto_names(spec, place) -> None:
    # Given a registered channel and a place the how-to names
    path, needle = (_fill(part, spec) for part in place)
    # Then the file exists and holds what the how-to says it holds for that channel
    file = ROOT / path
    assert file.is_file(), f"{path} (named by the how-to) does not exist for {spec.name}"
    assert needle in file.read_text(encoding="utf-8"), f"{path} has no {needle!r} for {spec.name}"


def test_every_channel_is_registered_once() -> None:
    assert [s.name for s in CHANNELS] == [c.value for c in Channel] and len(set(Channel)) == len(CHANNELS)
    assert all(spec_for(c).name == c.value and spec_for(c.value) is spec_for(c) for c in Channel)
    with pytest.raises(KeyError, match="no channel 'carrier-pigeon' is registered"):
        spec_for("carrier-pigeon")


@pytest.mark.parametrize("spec", CHANNELS, ids=lambda s: s.name)
def test_each_channels_template_function_relays_it_and_its_spec_resolves(spec) -> None:
    # Given the template with every channel on
    template = TemplateModel(every_condition=True)
    function = f"Relay{spec.template_prefix}Function"
    # Then its relay function relays that channel, under its switch
    assert template.function_environment(function)["OUTBOX_CHANNEL"] == spec.name
    assert template.resources[function]["Condition"] == f"{spec.template_prefix}Enabled"
    # And its settings, metrics, builder and validator are there
    assert spec.settings.model_fields, "a channel's settings name at least one variable"
    assert set(spec.metrics) <= set(obs.METRIC_UNITS)
    assert callable(_resolve(spec.builder)) and callable(spec.producer_function())
    # And its enqueue command's options are its producer function's keyword arguments
    import inspect

    from outbox_relay.publishers.spec import COMMON_OPTIONS

    parameters = inspect.signature(spec.producer_function()).parameters
    assert {o.field for o in (*spec.enqueue_options, *COMMON_OPTIONS)} <= set(parameters)


#: What every channel's block of template.yaml holds, by logical id (`{Prefix}` its template prefix).
CHANNEL_BLOCK = ("Relay{Prefix}LogGroup", "Relay{Prefix}Function", "Relay{Prefix}ErrorsAlarm",
                 "Relay{Prefix}ThrottlesAlarm", "Relay{Prefix}DurationAlarm", "Relay{Prefix}DeadLetteredAlarm",
                 "Relay{Prefix}DeliveryLagAlarm", "Relay{Prefix}OldestPendingAlarm",
                 "Relay{Prefix}SecondsWithoutPollerAlarm")


@pytest.mark.parametrize("spec", CHANNELS, ids=lambda s: s.name)
def test_each_registered_channel_has_its_whole_block_in_the_template_and_can_be_switched_off(spec) -> None:
    # Given the template as written
    template = TemplateModel()
    switch = f"{spec.template_prefix}Enabled"
    # Then the channel's block is there, every resource of it under its switch
    for name in (n.format(Prefix=spec.template_prefix) for n in CHANNEL_BLOCK):
        assert name in template.resources, f"template.yaml has no {name}"
        condition = template.resources[name].get("Condition")
        assert condition == switch or switch in str(template.doc["Conditions"].get(condition)), \
            f"{name} is not switched by {switch}"
    output = template.doc["Outputs"][f"Relay{spec.template_prefix}FunctionArn"]
    assert output["Condition"] == switch
    # And the rule that keeps one channel on names its switch's parameter
    assert switch in template.doc["Conditions"]
    rule = str(template.doc["Rules"]["AtLeastOneChannel"])
    parameter = str(template.doc["Conditions"][switch])
    assert any(p in rule for p in re.findall(r"'Ref': '(\w+)'", parameter)), f"AtLeastOneChannel ignores {switch}"


def test_the_producer_api_writes_only_registered_channels() -> None:
    # Given a row for a channel no package registers (the schema takes any name since 0007)
    from outbox_relay.errors import InvalidMessageError
    from outbox_relay.producer import insert_message

    row = dict(spec_for("redis").message_row({"stream": "orders", "type": "order.placed", "payload": {}}),
               channel="carrier-pigeon")
    # Then it is refused before any statement runs, naming the field
    with pytest.raises(InvalidMessageError) as err:
        insert_message(object(), row)
    assert err.value.field == "channel"

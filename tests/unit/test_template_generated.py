"""template.yaml is generated from infra/template/ (decision 0041): the committed
file is exactly what the generator writes for the registered channels, so a hand
edit, or a channel added without regenerating, fails here."""

from __future__ import annotations

import difflib

from outbox_relay.publishers.registry import CHANNELS
from outbox_tools import template as generator
from support.template import ROOT, TemplateModel


def test_the_committed_template_is_the_generated_one() -> None:
    committed = (ROOT / "template.yaml").read_text(encoding="utf-8")
    generated = generator.generate()
    if committed != generated:
        diff = "".join(list(difflib.unified_diff(committed.splitlines(keepends=True), generated.splitlines(keepends=True),
                                                 "template.yaml (committed)", "template.yaml (generated)"))[:40])
        raise AssertionError(f"template.yaml is not what infra/template/ generates; regenerate it with "
                             f"`{generator.COMMAND}` (edit infra/template/, not template.yaml)\n{diff}")


def test_each_registered_channel_has_its_file_and_one_block() -> None:
    template = TemplateModel()
    for spec in CHANNELS:
        assert (ROOT / "infra/template/channels" / f"{spec.name}.yaml").is_file()
        functions = [n for n, r in template.resources.items()
                     if r["Type"] == "AWS::Serverless::Function" and n.startswith("Relay")]
        assert functions.count(f"Relay{spec.template_prefix}Function") == 1
    # One relay function per registered channel, and no other
    assert sorted(functions) == sorted(f"Relay{s.template_prefix}Function" for s in CHANNELS)


def test_the_check_mode_passes_on_the_committed_template() -> None:
    assert generator.main(["--check"]) == 0


def test_the_local_files_are_the_generated_ones() -> None:
    # sam-env.json and samconfig.toml hold each channel's `local` values (decision 0061)
    for path, text in generator.outputs().items():
        assert path.read_text(encoding="utf-8") == text, f"{path.name}: run `{generator.COMMAND}`"


def test_a_channels_local_values_reach_sam_env_and_samconfig() -> None:
    # Given the generator's view of the channels, one of them with other local values
    channels = generator._channels()
    channels[0].local = {"switch": "placeholder-x", "environment": {"OUTBOX_X": "y"}}
    env = generator.sam_env(channels, (ROOT / "infra/sam-env.json").read_text(encoding="utf-8"))
    config = generator.samconfig(channels, (ROOT / "samconfig.toml").read_text(encoding="utf-8"))
    # Then its function's settings and its switch's placeholder are what the files say
    prefix, switch = channels[0].spec.template_prefix, channels[0].values["switch"]
    assert '"OUTBOX_X": "y"' in env and f'"Relay{prefix}Function"' in env and '"MaintenanceFunction"' in env
    assert config.count(f"{switch}=placeholder-x ") == 2 and "SubnetIds=" in config

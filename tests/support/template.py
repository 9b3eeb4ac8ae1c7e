"""template.yaml as data, for tests: load it, evaluate its intrinsic functions
for given parameter values, and list the metrics its alarms and dashboard use.

Only the intrinsics the template uses are evaluated (Ref, Fn::Sub, Fn::Join,
Fn::Split, Fn::Select, Fn::If, Fn::GetAtt, Fn::Equals/Not/And/Or in conditions). A resource's Ref or
attribute evaluates to a placeholder: `<Name>` or `<Name.Attribute>`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from cfnlint.decode import cfn_yaml

ROOT = Path(__file__).resolve().parents[2]
NO_VALUE = object()
PSEUDO = {"AWS::Region": "eu-west-1", "AWS::AccountId": "123456789012", "AWS::Partition": "aws",
          "AWS::StackName": "outbox-prod", "AWS::URLSuffix": "amazonaws.com"}


class TemplateModel:
    """The template evaluated for `parameters` (others at their defaults).

    With `every_condition=True` every condition is true (every channel
    deployed) and a parameter whose value is empty evaluates to `<Name>`, so
    that what it would hold stays visible in the result.
    """

    def __init__(self, parameters: dict[str, str] | None = None, *, every_condition: bool = False,
                 path: Path = ROOT / "template.yaml") -> None:
        self.doc: dict[str, Any] = cfn_yaml.load(str(path))
        self.resources: dict[str, Any] = self.doc["Resources"]
        self.every_condition = every_condition
        self.parameters = {name: str(p.get("Default", "")) for name, p in self.doc["Parameters"].items()}
        unknown = set(parameters or {}) - set(self.parameters)
        assert not unknown, f"not parameters of the template: {unknown}"
        self.parameters.update(parameters or {})

    # --- evaluation --------------------------------------------------------
    def value(self, name: str) -> Any:
        if name == "AWS::NoValue":
            return NO_VALUE
        if name in PSEUDO:
            return PSEUDO[name]
        if name in self.parameters:
            value = self.parameters[name] or (f"<{name}>" if self.every_condition else "")
            if self.doc["Parameters"][name]["Type"] == "CommaDelimitedList":
                return [v.strip() for v in value.split(",")] if value else []
            return value
        base = name.split(".", 1)[0]
        assert base in self.resources, f"reference to unknown {name}"
        return f"<{name}>"

    def condition(self, name: str) -> bool:
        if self.every_condition:
            return True
        return bool(self._condition(self.doc["Conditions"][name]))

    def _condition(self, node: Any) -> Any:
        if isinstance(node, dict) and len(node) == 1:
            (key, arg), = node.items()
            if key == "Fn::Equals":
                return self._condition(arg[0]) == self._condition(arg[1])
            if key == "Fn::Not":
                return not self._condition(arg[0])
            if key == "Fn::And":
                return all(self._condition(a) for a in arg)
            if key == "Fn::Or":
                return any(self._condition(a) for a in arg)
            if key == "Condition":
                return self.condition(arg)
            if key == "Ref":
                return self.parameters[arg] if arg in self.parameters else self.value(arg)
            if key == "Fn::Join":
                return arg[0].join(str(self._condition(x)) for x in self._list(arg[1]))
        return node

    def _list(self, node: Any) -> list[Any]:
        """A list argument: as written, or a CommaDelimitedList parameter's items."""
        if isinstance(node, dict) and "Ref" in node:
            value = self.parameters.get(node["Ref"], "")
            return [v.strip() for v in value.split(",")] if value else []
        return node

    def resolve(self, node: Any) -> Any:
        if isinstance(node, dict) and len(node) == 1:
            (key, arg), = node.items()
            if key == "Ref":
                return self.value(arg)
            if key == "Fn::GetAtt":
                return f"<{'.'.join(arg) if isinstance(arg, list) else arg}>"
            if key == "Fn::If":
                return self.resolve(arg[1] if self.condition(arg[0]) else arg[2])
            if key == "Fn::Join":
                items = self.resolve(arg[1])
                return arg[0].join(str(x) for x in (items if isinstance(items, list) else [items]))
            if key == "Fn::Split":
                return str(self.resolve(arg[1])).split(arg[0])
            if key == "Fn::Select":
                items = self.resolve(arg[1])
                # `<Name>` (an empty parameter under every_condition) has no parts: it stands for each.
                return items[int(arg[0])] if len(items) > int(arg[0]) else "".join(items)
            if key == "Fn::Sub":
                text, local = (arg, {}) if isinstance(arg, str) else (arg[0], {k: self.resolve(v)
                                                                             for k, v in arg[1].items()})
                return re.sub(r"\$\{([^}!]+)\}",
                              lambda m: str(local[m[1]] if m[1] in local else self.value(m[1])), text)
        if isinstance(node, dict):
            out = {k: self.resolve(v) for k, v in node.items()}
            return {k: v for k, v in out.items() if v is not NO_VALUE}
        if isinstance(node, list):
            return [v for v in (self.resolve(x) for x in node) if v is not NO_VALUE]
        return node

    # --- views -------------------------------------------------------------
    def of_type(self, kind: str) -> dict[str, dict[str, Any]]:
        return {name: r for name, r in self.resources.items() if r["Type"] == kind}

    def deployed(self, name: str) -> bool:
        condition = self.resources[name].get("Condition")
        return condition is None or self.condition(condition)

    def function_environment(self, function: str) -> dict[str, str]:
        """The variables a function gets: Globals merged with its own, evaluated."""
        merged = dict(self.doc["Globals"]["Function"]["Environment"]["Variables"])
        merged.update(self.resources[function]["Properties"].get("Environment", {}).get("Variables", {}))
        return {k: str(v) for k, v in self.resolve(merged).items()}

    def metrics_namespace(self) -> str:
        return self.resolve(self.doc["Globals"]["Function"]["Environment"]["Variables"]["POWERTOOLS_METRICS_NAMESPACE"])

    def dashboard_series(self) -> list[tuple[str, str, dict[str, str]]]:
        """(namespace, metric name, dimensions) of every dashboard series."""
        (dashboard,) = self.of_type("AWS::CloudWatch::Dashboard").values()
        body = json.loads(self.resolve(dashboard["Properties"]["DashboardBody"]))
        series = []
        for widget in body["widgets"]:
            for entry in widget.get("properties", {}).get("metrics", []):
                parts = [p for p in entry if not isinstance(p, dict)]
                if not parts:  # a metric math expression over the series above it
                    continue
                assert "." not in parts and "..." not in parts, f"write dashboard series out in full: {entry}"
                series.append((parts[0], parts[1], dict(zip(parts[2::2], parts[3::2]))))
        return series

    def alarm_metrics(self) -> list[tuple[str, str, str, dict[str, str]]]:
        """(alarm, namespace, metric name, dimensions) of every metric a deployed alarm watches."""
        out = []
        for name, alarm in self.of_type("AWS::CloudWatch::Alarm").items():
            if not self.deployed(name):
                continue
            props = self.resolve(alarm["Properties"])
            watched = ([props] if "MetricName" in props
                       else [m["MetricStat"]["Metric"] for m in props["Metrics"] if "MetricStat" in m])
            for m in watched:
                dims = {d["Name"]: d["Value"] for d in m.get("Dimensions", [])}
                out.append((name, m["Namespace"], m["MetricName"], dims))
        return out

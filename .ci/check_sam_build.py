"""Check what `sam build` produced (CI, after `sam build --build-dir DIR`).

Usage: python .ci/check_sam_build.py DIR

- every function's artifact holds its handler module with the handler
  function defined in it;
- the layer's `python/` holds the outbox_relay package (every module of
  shared/outbox_relay) and a distribution of every requirement in
  shared/requirements.txt, at a version its specifier allows;
- compiled extensions in the layer are for arm64 (aarch64), the functions'
  architecture;
- function code plus layer stays under Lambda's 250 MB unzipped limit
  ("Lambda quotas", AWS Lambda Developer Guide).

Exits 1 with one line per problem.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from cfnlint.decode import cfn_yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
UNZIPPED_LIMIT_BYTES = 250 * 1024 * 1024
ELF_MACHINE_AARCH64 = 183


def size_of(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def elf_machine(path: Path) -> int | None:
    head = path.read_bytes()[:20]
    if head[:4] != b"\x7fELF":
        return None
    return int.from_bytes(head[18:20], "little" if head[5] == 1 else "big")


def installed_versions(site: Path) -> dict[str, str]:
    found: dict[str, str] = {}
    for info in site.glob("*.dist-info"):
        name, _, version = info.name[: -len(".dist-info")].partition("-")
        found[canonicalize_name(name)] = version
    return found


def check(build_dir: Path) -> list[str]:
    problems: list[str] = []
    template = cfn_yaml.load(str(build_dir / "template.yaml"))
    resources = template["Resources"]
    layers = {k: v for k, v in resources.items() if v["Type"] == "AWS::Serverless::LayerVersion"}
    functions = {k: v for k, v in resources.items() if v["Type"] == "AWS::Serverless::Function"}
    if not layers or not functions:
        return [f"built template has {len(layers)} layers and {len(functions)} functions"]

    layer_size = 0
    for name, layer in layers.items():
        site = build_dir / layer["Properties"]["ContentUri"] / "python"
        layer_size += size_of(site.parent)
        for module in (ROOT / "shared" / "outbox_relay").rglob("*.py"):
            rel = module.relative_to(ROOT / "shared")
            if not (site / rel).is_file():
                problems.append(f"{name}: python/{rel} missing")
        versions = installed_versions(site)
        for line in (ROOT / "shared" / "requirements.txt").read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            req = Requirement(line)
            version = versions.get(canonicalize_name(req.name))
            if version is None:
                problems.append(f"{name}: requirement {req.name} not installed in python/")
            elif not req.specifier.contains(version, prereleases=True):
                problems.append(f"{name}: {req.name} {version} does not satisfy {req.specifier}")
        extensions = list(site.rglob("*.so"))
        if not extensions:
            problems.append(f"{name}: no compiled extension found (pydantic-core has one)")
        for so in extensions:
            machine = elf_machine(so)
            if machine is not None and machine != ELF_MACHINE_AARCH64:
                problems.append(f"{name}: {so.relative_to(site)} is not an arm64 binary (ELF machine {machine})")

    for name, function in functions.items():
        props = function["Properties"]
        code = build_dir / props["CodeUri"]
        module_name, _, attr = props["Handler"].rpartition(".")
        module = code / (module_name.replace(".", "/") + ".py")
        if not module.is_file():
            problems.append(f"{name}: {props['Handler']}: {module.relative_to(build_dir)} missing")
            continue
        tree = ast.parse(module.read_text(encoding="utf-8"))
        if not any(isinstance(n, ast.FunctionDef) and n.name == attr for n in tree.body):
            problems.append(f"{name}: {module.relative_to(build_dir)} defines no function {attr}()")
        total = size_of(code) + layer_size
        if total >= UNZIPPED_LIMIT_BYTES:
            problems.append(f"{name}: code and layers are {total / 2**20:.0f} MB unzipped, over 250 MB")

    if not problems:
        print(f"sam build output checked: {len(functions)} functions, {len(layers)} layer(s), "
              f"layer {layer_size / 2**20:.0f} MB unzipped")
    return problems


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    problems = check(Path(argv[1]))
    for problem in problems:
        print(f"sam build output: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

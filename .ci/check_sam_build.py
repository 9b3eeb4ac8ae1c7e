"""Check what `sam build` produced (CI, after `sam build --build-dir DIR`).

Usage: python .ci/check_sam_build.py DIR [--architecture arm64|x86_64]

- every function's artifact holds its handler module with the handler
  function defined in it;
- each layer holds its package (every module and data file) and a
  distribution of every requirement of its requirements.txt, at a version its
  specifier allows: the relay's layer (`shared/`) outbox_relay, the migrations
  layer (`migrations/`) outbox_migrations;
- the relay's layer holds nothing a workstation only uses: no outbox_tools or
  outbox_migrations package, no click, rich, alembic or mako distribution, and
  no module of outbox_relay imports one of them; the migrations layer holds no
  outbox_tools, click or rich, no copy of outbox_relay (it comes from the
  relay's layer), and any distribution both layers hold is at one version;
- only a function whose handler imports outbox_migrations has the migrations
  layer;
- compiled extensions in the layers are for the functions' architecture
  (arm64, aarch64; `--architecture x86_64` for a build for the host's, as the
  sam_local tests make);
- function code plus its layers stays under Lambda's 250 MB unzipped limit
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
WORKSTATION_PACKAGES = ("outbox_tools", "outbox_migrations")
WORKSTATION_DISTRIBUTIONS = ("click", "rich", "alembic", "mako")
#: What each layer's source directory (ContentUri) must and must not hold.
LAYERS = {
    "shared": {"package": "outbox_relay", "data": ("*.sql",), "forbidden_packages": WORKSTATION_PACKAGES,
               "forbidden_distributions": WORKSTATION_DISTRIBUTIONS,
               "forbidden_imports": WORKSTATION_PACKAGES + WORKSTATION_DISTRIBUTIONS, "needs_extension": True},
    # outbox_relay is imported from the relay's layer, never copied into this one.
    "migrations": {"package": "outbox_migrations", "data": ("*.mako",),
                   "forbidden_packages": ("outbox_tools", "outbox_relay"),
                   "forbidden_distributions": ("click", "rich"),
                   "forbidden_imports": ("outbox_tools", "click", "rich"), "needs_extension": False},
}
ELF_MACHINES = {"arm64": 183, "x86_64": 62}


def size_of(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def elf_machine(path: Path) -> int | None:
    head = path.read_bytes()[:20]
    if head[:4] != b"\x7fELF":
        return None
    return int.from_bytes(head[18:20], "little" if head[5] == 1 else "big")


def imported_top_levels(module: Path) -> set[str]:
    """Top-level names of the absolute imports anywhere in a module."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(module.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def installed_versions(site: Path) -> dict[str, str]:
    found: dict[str, str] = {}
    for info in site.glob("*.dist-info"):
        name, _, version = info.name[: -len(".dist-info")].partition("-")
        found[canonicalize_name(name)] = version
    return found


def layer_kinds() -> dict[str, str]:
    """Layer logical id -> its source directory's name, from the source template."""
    source = cfn_yaml.load(str(ROOT / "template.yaml"))["Resources"]
    return {name: str(r["Properties"]["ContentUri"]).strip("/") for name, r in source.items()
            if r["Type"] == "AWS::Serverless::LayerVersion"}


def check_layer(name: str, kind: str, site: Path, machine: int) -> list[str]:
    rules = LAYERS[kind]
    problems: list[str] = []
    package = rules["package"]
    source = ROOT / kind / package
    for module in [*source.rglob("*.py"), *(f for pattern in rules["data"] for f in source.rglob(pattern))]:
        if "__pycache__" in module.parts:
            continue
        rel = module.relative_to(ROOT / kind)
        if not (site / rel).is_file():
            problems.append(f"{name}: python/{rel} missing")
    versions = installed_versions(site)
    problems += [f"{name}: python/{pkg} does not belong in this layer" for pkg in rules["forbidden_packages"]
                 if (site / pkg).exists()]
    problems += [f"{name}: {dist} {versions[dist]} is installed, a workstation-only distribution"
                 for dist in rules["forbidden_distributions"] if dist in versions]
    for module in (site / package).rglob("*.py"):
        for imported in imported_top_levels(module):
            if imported in rules["forbidden_imports"]:
                problems.append(f"{name}: {module.relative_to(site)} imports {imported}")
    for line in (ROOT / kind / "requirements.txt").read_text().splitlines():
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
    if rules["needs_extension"] and not extensions:
        problems.append(f"{name}: no compiled extension found (pydantic-core has one)")
    for so in extensions:
        found = elf_machine(so)
        if found is not None and found != machine:
            problems.append(f"{name}: {so.relative_to(site)} is built for ELF machine {found}, not {machine}")
    return problems


def check(build_dir: Path, architecture: str = "arm64") -> list[str]:
    problems: list[str] = []
    template = cfn_yaml.load(str(build_dir / "template.yaml"))
    resources = template["Resources"]
    layers = {k: v for k, v in resources.items() if v["Type"] == "AWS::Serverless::LayerVersion"}
    functions = {k: v for k, v in resources.items() if v["Type"] == "AWS::Serverless::Function"}
    if not layers or not functions:
        return [f"built template has {len(layers)} layers and {len(functions)} functions"]
    kinds = layer_kinds()
    unknown = set(layers) - {n for n, k in kinds.items() if k in LAYERS}
    if unknown:
        return [f"layers {sorted(unknown)} are not known to this check (LAYERS)"]

    sizes: dict[str, int] = {}
    sites: dict[str, Path] = {}
    for name, layer in layers.items():
        site = build_dir / layer["Properties"]["ContentUri"] / "python"
        sites[name] = site
        sizes[name] = size_of(site.parent)
        problems += check_layer(name, kinds[name], site, ELF_MACHINES[architecture])
    shared = [n for n in layers if kinds[n] == "shared"]
    for name in layers:
        if kinds[name] == "shared":
            continue
        mine = installed_versions(sites[name])
        for other in shared:
            theirs = installed_versions(sites[other])
            problems += [f"{name}: {dist} {mine[dist]} beside {theirs[dist]} in {other}; one copy would shadow "
                         "the other" for dist in sorted(set(mine) & set(theirs)) if mine[dist] != theirs[dist]]

    global_layers = template.get("Globals", {}).get("Function", {}).get("Layers", [])
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
        used = [ref["Ref"] for ref in [*global_layers, *props.get("Layers", [])]]
        wants_migrations = "outbox_migrations" in imported_top_levels(module)
        has_migrations = any(kinds.get(layer) == "migrations" for layer in used)
        if wants_migrations != has_migrations:
            problems.append(f"{name}: {'lacks' if wants_migrations else 'has'} the migrations layer, "
                            f"and its handler {'imports' if wants_migrations else 'does not import'} outbox_migrations")
        total = size_of(code) + sum(sizes.get(layer, 0) for layer in used)
        if total >= UNZIPPED_LIMIT_BYTES:
            problems.append(f"{name}: code and layers are {total / 2**20:.0f} MB unzipped, over 250 MB")

    if not problems:
        described = ", ".join(f"{n} {sizes[n] / 2**20:.0f} MB" for n in layers)
        print(f"sam build output checked ({architecture}): {len(functions)} functions, {len(layers)} layers "
              f"({described} unzipped)")
    return problems


def main(argv: list[str]) -> int:
    args = argv[1:]
    architecture = "arm64"
    if len(args) == 3 and args[1] == "--architecture" and args[2] in ELF_MACHINES:
        architecture = args[2]
        args = args[:1]
    if len(args) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    problems = check(Path(args[0]), architecture)
    for problem in problems:
        print(f"sam build output: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

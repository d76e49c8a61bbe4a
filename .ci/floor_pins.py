"""Prints pip constraints that pin each of hcfuse's requirements with a floor to that floor (`name>=X` gives
`name==X`): the project's dependencies and those of the extras named. CI installs the suite's environment
with them to check that the floors in pyproject.toml still hold.

Usage: python3 .ci/floor_pins.py [EXTRA ...]
"""

import pathlib
import re
import sys
import tomllib

_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*([^;]*)")


def floor_pins(project: dict, extras: list[str]) -> list[str]:
    optional = project.get("optional-dependencies", {})
    unknown = [e for e in extras if e not in optional]
    if unknown:
        raise SystemExit(f"floor_pins: no extra {', '.join(unknown)} in pyproject.toml (it has {', '.join(optional)})")
    pins = []
    for requirement in [*project["dependencies"], *(r for e in extras for r in optional[e])]:
        name, specifiers = _REQUIREMENT.match(requirement).groups()
        floor = re.search(r">=\s*([^,\s]+)", specifiers)
        if floor:
            pins.append(f"{name}=={floor.group(1)}")
    return pins


if __name__ == "__main__":
    pyproject = pathlib.Path(__file__).parents[1] / "pyproject.toml"
    print("\n".join(floor_pins(tomllib.loads(pyproject.read_text())["project"], sys.argv[1:])))

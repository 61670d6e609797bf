"""Print the third-party requirements of the image's parts, one per line, for a pip layer of
their own (deploy/Dockerfile): a change to steplens's sources then reinstalls only steplens.

usage: python image_requirements.py PART[EXTRAS] ...   e.g. producer[exporter,gpu] sinks
Reads PART/pyproject.toml; the parts' requirements of each other (steplens-*) are left out.
"""

from __future__ import annotations

import re
import sys
import tomllib


def requirements(spec: str) -> list[str]:
    part, _, extras = spec.partition("[")
    project = tomllib.load(open(f"{part}/pyproject.toml", "rb"))["project"]
    found = list(project.get("dependencies", []))
    for extra in filter(None, extras.rstrip("]").split(",")):
        found += project.get("optional-dependencies", {})[extra.strip()]
    return [r for r in found if not re.match(r"steplens-", r)]


if __name__ == "__main__":
    for spec in sys.argv[1:]:
        print("\n".join(requirements(spec)))

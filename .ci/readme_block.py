"""Prints the commands of the README's fenced block marked `<!-- ci: NAME -->` (CI runs them as written).

Usage: python3 .ci/readme_block.py NAME [README.md]
"""

import pathlib
import sys


def block(name: str, text: str) -> str:
    lines = text.splitlines()
    marker = f"<!-- ci: {name} -->"
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == marker)
        fence = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("```"))
        end = next(i for i in range(fence + 1, len(lines)) if lines[i].startswith("```"))
    except StopIteration:
        raise SystemExit(f"readme_block: no fenced block after {marker!r}") from None
    return "\n".join(lines[fence + 1 : end]) + "\n"


if __name__ == "__main__":
    readme = pathlib.Path(sys.argv[2] if len(sys.argv) > 2 else pathlib.Path(__file__).parents[1] / "README.md")
    sys.stdout.write(block(sys.argv[1], readme.read_text()))

"""Add the sha256 of wheels found in a local folder to their unhashed pins in a lock file.

`uv pip compile --generate-hashes` hashes the files its indexes list, not the wheels of a
`--find-links` folder (torch's CPU wheel from TORCH_WHEELS): `make lock` runs this after it, so
that `pip install --require-hashes` accepts the lock.

    python requirements/hash_local_wheels.py LOCK WHEEL_FOLDER
"""

from __future__ import annotations

import hashlib
import re
import sys
from pathlib import Path


def wheel_pins(folder: Path) -> dict[str, str]:
    """`name==version` of each wheel in `folder` -> its sha256."""
    pins = {}
    for wheel in folder.glob("*.whl"):
        name, version = wheel.name.split("-")[:2]
        pins[f"{name.lower().replace('_', '-')}=={version}"] = hashlib.sha256(
            wheel.read_bytes()).hexdigest()
    return pins


def add_hashes(lock: str, pins: dict[str, str]) -> str:
    """The lock with `--hash` added to each pin that has none and names a local wheel."""
    lines = lock.splitlines()
    out = []
    for index, line in enumerate(lines):
        following = lines[index + 1] if index + 1 < len(lines) else ""
        pin = line.strip()
        if pin in pins and not line.endswith("\\") and "--hash" not in following:
            out.append(f"{pin} \\")
            out.append(f"    --hash=sha256:{pins[pin]}")
        else:
            out.append(line)
    return "\n".join(out) + "\n"


def main() -> int:
    lock, folder = Path(sys.argv[1]), Path(sys.argv[2])
    text = add_hashes(lock.read_text(encoding="utf-8"), wheel_pins(folder))
    unhashed = [m.group(1) for m in re.finditer(r"^(\S+==\S+)$", text, re.MULTILINE)]
    if unhashed:
        print(f"{lock}: no hash for {', '.join(unhashed)}", file=sys.stderr)
        return 1
    lock.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

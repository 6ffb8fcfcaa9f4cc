"""Lays out the harness's test tree in tests/clients/vllm_openai/vendored/ (git-ignored): vLLM's test files at
their vLLM paths, copied from upstream/ (committed: the files as fetched from GitHub at the commits sources.json pins,
unchanged, with vLLM's LICENSE), and the shims (shim/) where vLLM's tests/utils.py, tests/conftest.py,
pytest_asyncio and the few vllm imports would be.

    python -m tests.clients.vllm_openai.populate            # lay out vendored/ (run.py does it too)
    python -m tests.clients.vllm_openai.populate --refetch  # fetch every file into upstream/ again (network)

NOTE: committed, not fetched at setup: CI has no network, and the check skipped there while the files were fetched.
vLLM is Apache-2.0 (upstream/LICENSE); each file keeps its SPDX header.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
VENDORED = HERE / "vendored"
UPSTREAM = HERE / "upstream"
SHIM = HERE / "shim"
RAW_URL = "https://raw.githubusercontent.com/{repository}/{commit}/{path}"
SHIM_PLACES = {"tests_utils.py": "tests/utils.py", "tests_conftest.py": "tests/conftest.py",
               "pytest_asyncio.py": "pytest_asyncio.py"}
OLD_LAYOUT_IMPORT = '''"""Shim: test_tokenization imports the zephyr_lora_files fixture from the old
tests/entrypoints/openai/test_completion.py; CoRun serves no LoRA, so it is a fixture that skips."""

import pytest


@pytest.fixture(scope="module")
def zephyr_lora_files():
    pytest.skip("CoRun serves no LoRA adapters")
'''


def sources() -> dict:
    return json.loads((HERE / "sources.json").read_text())


def place_shims() -> None:
    for name, place in SHIM_PLACES.items():
        copy(SHIM / name, VENDORED / place)
    shutil.copytree(SHIM / "vllm", VENDORED / "vllm", dirs_exist_ok=True)
    (VENDORED / "tests/entrypoints/openai").mkdir(parents=True, exist_ok=True)
    (VENDORED / "tests/entrypoints/openai/test_completion.py").write_text(OLD_LAYOUT_IMPORT)
    (VENDORED / "pytest.ini").write_text("[pytest]\n")


def copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)


def fetch(repository: str, entry: dict) -> None:
    url = RAW_URL.format(repository=repository, **entry)
    with urllib.request.urlopen(url, timeout=30) as reply:
        text = reply.read()
    target = UPSTREAM / entry["path"]
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(text)
    print(f"fetched {entry['path']} @ {entry['commit'][:12]}")


def lay_out() -> None:
    """vendored/: vLLM's files (from upstream/), the shims, and the packages vLLM's tests import each other by."""
    for entry in sources()["files"]:
        copy(UPSTREAM / entry["path"], VENDORED / entry["path"])
    place_shims()
    add_packages()


def add_packages() -> None:
    """vLLM's test directories are packages (its tests import each other relatively)."""
    for directory in [VENDORED / "tests", *(p for p in (VENDORED / "tests").rglob("*") if p.is_dir())]:
        (directory / "__init__.py").touch(exist_ok=True)


def missing() -> list[str]:
    return [entry["path"] for entry in sources()["files"] if not (UPSTREAM / entry["path"]).exists()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--refetch", action="store_true")
    args = parser.parse_args(argv)
    spec = sources()
    failed = []
    for entry in spec["files"] if args.refetch else []:
        try:
            fetch(spec["repository"], entry)
        except OSError as error:
            failed.append(f"{entry['path']}: {error}")
    for line in failed:
        print(f"not fetched: {line}", file=sys.stderr)
    if missing():
        print(f"not in upstream/: {missing()}", file=sys.stderr)
        return 1
    lay_out()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""The wheels a device machine needs to run gpupool, gathered here, since nothing can be fetched
there: the packages gpupool needs that the machine's image lacks, at the versions this checkout
is tested with, for the image's Python, and gpupool's own wheel built from this checkout.

    .venv/bin/python -m benchmarks.gpu.wheels      # fills .whl/ (git-ignored), prints its size

The device call then carries `.whl` and starts with `INSTALL` (docs/gpu.md).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

FOLDER = Path(".whl")
"""Where the wheels go, in the repository's root: git-ignored, carried by the device call."""

IMAGE_PYTHON = "3.12"
"""The Python of the device image (3.12.3, at /opt/torch/.venv/bin/python3, as read there in
2026-11): binary wheels are fetched for it."""

PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64")

IMAGE_HAS = frozenset(
    {
        "annotated-doc",
        "anyio",
        "click",
        "h11",
        "httpx",
        "idna",
        "jinja2",
        "markupsafe",
        "matplotlib",
        "numpy",
        "nvidia-ml-py",
        "prometheus-client",
        "psutil",
        "pygments",
        "pyyaml",
        "rich",
        "setuptools",
        "shellingham",
        "typer",
        "uvloop",
    }
)
"""Of what gpupool imports, the packages the device image holds (its package list, read on a
machine running it on 2026-11-17): they are used as they are there."""

MISSING = (
    "alembic",
    "annotated-types",
    "fastapi",
    "fastapi-offline",
    "httptools",
    "mako",
    "opentelemetry-api",
    "pydantic",
    "pydantic-core",
    "sniffio",
    "sqlalchemy",
    "starlette",
    "typing-extensions",
    "typing-inspection",
    "uvicorn",
    "websockets",
)
"""What gpupool needs that the image lacks (sniffio is not in its list, though what imports it
here may not there), or has older than gpupool's versions need (typing-extensions): carried, at
this checkout's versions. PostgreSQL's driver is left out (the check uses the embedded SQLite)."""

INSTALL = (
    "python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade "
    "--target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1"
)
"""The line a device call starts with: the wheels into a folder of their own, first on the path."""


def pinned() -> list[str]:
    """`name==version` of each package to carry, as installed in this checkout's environment."""
    return [f"{name}=={version(name)}" for name in MISSING]


def download(folder: Path = FOLDER) -> list[Path]:
    """Fetch the wheels into `folder` (emptied first) and build gpupool's own there."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    pip = [sys.executable, "-m", "pip", "-q"]
    binary = ["--no-deps", "--only-binary=:all:", "--python-version", IMAGE_PYTHON, "--implementation", "cp"]
    for requirement in pinned():
        subprocess.run([*pip, "download", *binary, *platforms, "-d", str(folder), requirement], check=True)
    subprocess.run([*pip, "wheel", "--no-deps", "-w", str(folder), "."], check=True)
    return sorted(folder.glob("*.whl"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--folder", type=Path, default=FOLDER)
    args = parser.parse_args()
    wheels = download(args.folder)
    size = sum(w.stat().st_size for w in wheels)
    for wheel in wheels:
        print(f"{wheel.stat().st_size / 2**20:6.2f} MiB  {wheel.name}")
    print(f"{len(wheels)} wheels, {size / 2**20:.1f} MiB in {args.folder} (a device call carries at most 64 MiB)")


if __name__ == "__main__":
    main()

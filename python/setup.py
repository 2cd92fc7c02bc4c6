"""What pyproject.toml cannot declare: the version, from Cargo, and the wheel's tag.

setuptools cannot read a version from Cargo.toml by itself, and a copy here would drift; so
it asks cargo for the version of the `portalloc` crate, the one `portalloc_version()` of the
library reports. The library does not link libpython, so the wheel is tagged for every
CPython 3 from the oldest `requires-python` allows (abi3) rather than for the one building it.
"""

import json
import os
import subprocess

from setuptools import setup

HERE = os.path.dirname(os.path.abspath(__file__))
CAPI_MANIFEST = os.path.join(HERE, os.pardir, "capi", "Cargo.toml")


def cargo_version():
    """The version of the portalloc crate, from ``cargo metadata`` (no network: no deps)."""
    metadata = subprocess.run(
        [
            os.environ.get("CARGO", "cargo"),
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--manifest-path",
            CAPI_MANIFEST,
        ],
        check=True,
        stdout=subprocess.PIPE,
        universal_newlines=True,
    ).stdout
    packages = json.loads(metadata)["packages"]
    return next(p["version"] for p in packages if p["name"] == "portalloc")


setup(
    version=cargo_version(),
    options={"bdist_wheel": {"py_limited_api": "cp39"}},
)

"""What pyproject.toml cannot declare: the Rust library's manifest, the version, the wheel's
tag, and the Rust sources an sdist carries.

The library is the workspace member ``capi/``, outside this directory, so a source
distribution made of this directory alone could not build it (pip would unpack it away from
the repository, where ``../capi`` is nothing). The ``sdist`` command below therefore copies the
Rust workspace the library needs into the sdist, under ``rust/``: for each of the four
packages (``portalloc``, ``portalloc-sys``, ``portalloc-capi``, and ``portalloc-fakes``, whose
C drivers ``portalloc.testing`` builds) the files ``cargo package
--list`` names (the sources, ``build.rs``, the licenses; the root's ``Cargo.lock``), with the
packages' own manifests, plus the entry file of every target but the tests (cargo refuses a
manifest whose declared bench or example file is missing, though building the library never
compiles them). setuptools-rust does not do this itself: its ``--vendor-crates`` vendors
the registry dependencies, not path dependencies outside the project (PyO3/setuptools-rust#507).

Where ``rust/`` exists next to this file (an unpacked sdist) the library is built from it;
otherwise from the repository (``../capi``), as ``pip install ./python`` does.

setuptools cannot read a version from Cargo.toml by itself, and a copy here would drift; so
it asks cargo for the version of the `portalloc` crate, the one `portalloc_version()` of the
library reports. The library does not link libpython, so the wheel is tagged for every
CPython 3 from the oldest `requires-python` allows (abi3) rather than for the one building it.
"""

import json
import os
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist
from setuptools_rust import Binding, RustExtension

HERE = os.path.dirname(os.path.abspath(__file__))
# The Rust sources inside an sdist (relative to its root), written by `SdistWithRust`.
SDIST_RUST = "rust"
# The workspace root: the sdist's copy when there is one, else the repository.
if os.path.isfile(os.path.join(HERE, SDIST_RUST, "Cargo.toml")):
    WORKSPACE = os.path.join(HERE, SDIST_RUST)
    CAPI_MANIFEST_REL = os.path.join(SDIST_RUST, "capi", "Cargo.toml")
else:
    WORKSPACE = os.path.normpath(os.path.join(HERE, os.pardir))
    CAPI_MANIFEST_REL = os.path.join(os.pardir, "capi", "Cargo.toml")
CAPI_MANIFEST = os.path.join(HERE, CAPI_MANIFEST_REL)
# The packages the library is built from, by name (their directories come from cargo), and the
# test kit, whose fake drivers' C sources `portalloc.testing` builds (and whose manifest the
# workspace names as a member).
RUST_PACKAGES = ("portalloc", "portalloc-sys", "portalloc-capi", "portalloc-fakes")
# The fake drivers' C sources, in the workspace; installed as `portalloc/_fakes/`.
FAKES_SOURCES = os.path.join(WORKSPACE, "fakes", "drivers")
# What `cargo package --list` names that is cargo's own bookkeeping, not a source file.
CARGO_GENERATED = ("Cargo.toml.orig", ".cargo_vcs_info.json")


def cargo(*args):
    """Runs cargo (``$CARGO`` when set, as under a cargo build) and returns its stdout."""
    return subprocess.run(
        [os.environ.get("CARGO", "cargo"), *args],
        check=True,
        stdout=subprocess.PIPE,
        universal_newlines=True,
        cwd=WORKSPACE,
    ).stdout


def cargo_packages():
    """The workspace's packages, by name, from ``cargo metadata`` (no network: no deps)."""
    metadata = cargo(
        "metadata", "--format-version", "1", "--no-deps", "--manifest-path", CAPI_MANIFEST
    )
    return {p["name"]: p for p in json.loads(metadata)["packages"]}


def cargo_version():
    """The version of the portalloc crate."""
    return cargo_packages()["portalloc"]["version"]


def rust_sources():
    """The files, relative to the workspace root, that building the library needs: for each
    of `RUST_PACKAGES` what ``cargo package --list`` names, less cargo's bookkeeping, plus the
    entry file of each target but the tests. Sorted, without repeats."""
    packages = cargo_packages()
    files = set()
    for name in RUST_PACKAGES:
        package = packages[name]
        directory = os.path.dirname(package["manifest_path"])
        listed = cargo("package", "--list", "--allow-dirty", "--quiet", "-p", name)
        for line in listed.splitlines():
            if line and line not in CARGO_GENERATED:
                files.add(os.path.join(directory, line))
        for target in package["targets"]:
            # The tests are found (autotests), never declared: none is needed.
            if "test" not in target["kind"]:
                files.add(target["src_path"])
    # Cargo lists a Cargo.lock for each package (it would write one); only the workspace's is
    # a file, and it is the one cargo reads.
    # Paths are compared with their directories resolved (cargo may report them so), the
    # file names as they are: a link is copied under its own name.
    root = os.path.realpath(WORKSPACE)
    relative = set()
    for path in files:
        directory, name = os.path.split(path)
        path = os.path.relpath(os.path.join(os.path.realpath(directory), name), root)
        if os.path.basename(path) == "Cargo.lock" and path != "Cargo.lock":
            continue
        relative.add(path)
    return sorted(relative)


class SdistWithRust(sdist):
    """``sdist`` that also copies the Rust workspace the library is built from into the
    release tree, under `SDIST_RUST` (see the module's documentation)."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        for path in rust_sources():
            source = os.path.join(WORKSPACE, path)
            target = os.path.join(base_dir, SDIST_RUST, path)
            self.mkpath(os.path.dirname(target))
            # A copy of the file a link points to (the crates' LICENSE-* are links to the
            # repository's): the sdist must not hold links that point outside it.
            shutil.copyfile(source, target)
            shutil.copymode(source, target)


class BuildPyWithFakes(build_py):
    """``build_py`` that also installs the fake drivers' C sources (``fakes/drivers``, in the
    workspace) as ``portalloc/_fakes/``, which `portalloc.testing` compiles on first use: a
    package without a C compiler at install time, and no test fixture in the library."""

    def run(self):
        super().run()
        target = os.path.join(self.build_lib, "portalloc", "_fakes")
        self.mkpath(target)
        for name in sorted(os.listdir(FAKES_SOURCES)):
            if name.endswith((".c", ".h")):
                self.copy_file(os.path.join(FAKES_SOURCES, name), os.path.join(target, name))


setup(
    version=cargo_version(),
    # Declared here, not in pyproject.toml: the manifest is the sdist's copy or the
    # repository's. `portalloc/libportalloc.abi3.so`: a bare cdylib (no Python binding),
    # loaded with ctypes. It does not link libpython, so one wheel serves every Python 3
    # (abi3; tagged below).
    rust_extensions=[
        RustExtension(
            "portalloc.libportalloc", path=CAPI_MANIFEST_REL, binding=Binding.NoBinding
        )
    ],
    cmdclass={"sdist": SdistWithRust, "build_py": BuildPyWithFakes},
    options={"bdist_wheel": {"py_limited_api": "cp39"}},
)

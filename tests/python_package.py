"""The installed package, as a pip user has it.

Run by scripts/test with the python of a fresh virtual environment into which it installed
`./python` (`pip install ./python`), from a directory outside the source tree and without
PORTALLOC_LIBRARY or PYTHONPATH: what is imported must be the installed package, with the
library inside it. Standard library only. Prints "python_package: ok" on success.
"""

import ast
import importlib.metadata
import inspect
import os
import pathlib
import subprocess
import sys
import typing

SOURCE_TREE = pathlib.Path(__file__).resolve().parents[1]

import portalloc  # noqa: E402

PACKAGE = pathlib.Path(portalloc.__file__).resolve().parent

# The command of the README (and of issue #15's "done when"), as a user types it.
README_COMMAND = (
    "import portalloc; a = portalloc.Allocator.create(backend='host', host_simulated=True, "
    "host_capacity=1 << 30, ignore_env=True); print(a.stats())"
)


def imported_from_the_virtual_environment():
    assert sys.prefix != sys.base_prefix, "not a virtual environment: %s" % sys.prefix
    assert pathlib.Path(sys.prefix).resolve() in PACKAGE.parents, (PACKAGE, sys.prefix)
    source_package = SOURCE_TREE / "python"
    assert source_package not in PACKAGE.parents, "imported from the source: %s" % PACKAGE
    assert pathlib.Path.cwd().resolve() != SOURCE_TREE, "run from inside the source tree"


def the_library_is_inside_the_package():
    assert "PORTALLOC_LIBRARY" not in os.environ, "scripts/test must not set it"
    library = pathlib.Path(portalloc.library_path())
    assert library.parent == PACKAGE, (library, PACKAGE)
    portalloc.load()
    assert portalloc._lib_path == str(library), portalloc._lib_path


def the_version_comes_from_cargo():
    # portalloc_version() is the crate's CARGO_PKG_VERSION (tests/capi.rs checks that).
    library_version = portalloc.load().portalloc_version().decode()
    installed = importlib.metadata.version("portalloc")
    assert portalloc.__version__ == installed == library_version, (
        portalloc.__version__,
        installed,
        library_version,
    )


def public_functions():
    """Every public function and method: the names in ``__all__`` and their methods."""
    for name in portalloc.__all__:
        value = getattr(portalloc, name)
        if inspect.isfunction(value):
            yield name, value
        elif inspect.isclass(value) and value.__module__ == "portalloc":
            for member_name, member in vars(value).items():
                member = getattr(member, "__func__", member)  # classmethods
                member = getattr(member, "fget", member)  # properties
                if inspect.isfunction(member) and not member_name.startswith("_"):
                    yield "%s.%s" % (name, member_name), member
                elif member_name == "__init__" and inspect.isfunction(member):
                    yield "%s.__init__" % name, member


def every_public_function_is_typed():
    assert (PACKAGE / "py.typed").is_file(), "py.typed is not installed"
    checked = 0
    for name, fn in public_functions():
        hints = typing.get_type_hints(fn)
        parameters = [
            p
            for p in inspect.signature(fn).parameters.values()
            if p.name not in ("self", "cls")
        ]
        missing = [p.name for p in parameters if p.name not in hints]
        assert not missing, "%s: no type hint for %s" % (name, ", ".join(missing))
        assert "return" in hints, "%s: no return type" % name
        checked += 1
    assert checked >= 25, "only %d public functions found" % checked


def the_readme_command_works_from_the_root_directory():
    environment = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PORTALLOC_", "XLA_")) and k != "PYTHONPATH"
    }
    out = subprocess.run(
        [sys.executable, "-c", README_COMMAND],
        cwd="/",
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    print("from /: %s" % out.stdout.strip())
    stats = ast.literal_eval(out.stdout.strip())
    assert set(stats) == set(portalloc.Stats.__annotations__), stats
    assert stats["live_allocations"] == 0 and stats["bytes_in_use"] == 0, stats
    assert 0 < stats["bytes_limit"] <= 1 << 30, stats


CHECKS = [
    imported_from_the_virtual_environment,
    the_library_is_inside_the_package,
    the_version_comes_from_cargo,
    every_public_function_is_typed,
    the_readme_command_works_from_the_root_directory,
]


def main():
    for check in CHECKS:
        check()
        print("ok   %s" % check.__name__, flush=True)
    print("python_package: ok (portalloc %s, %s)" % (portalloc.__version__, PACKAGE))
    return 0


if __name__ == "__main__":
    sys.exit(main())

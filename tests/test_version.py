"""jax_dash.__version__ and BITS_VERSION (jax_dash/_version.py), and what an install ships."""

import importlib.metadata
import pathlib
import re

import pytest

import jax_dash
from jax_dash import _version

_RELEASE = re.compile(r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)")


def _installed_distribution():
    """The installed distribution jax_dash was imported from, or None.

    None when jax_dash is not installed, when it is an editable install, or when this process
    imports a checkout's jax_dash/ rather than the installed copy (`python -m pytest` from a
    checkout): the installed metadata may then describe older code.
    """
    try:
        dist = importlib.metadata.distribution("jax_dash")
    except importlib.metadata.PackageNotFoundError:
        return None
    init = pathlib.Path(jax_dash.__file__).resolve()
    for f in dist.files or ():
        if f.as_posix() == "jax_dash/__init__.py" and pathlib.Path(dist.locate_file(f)).resolve() == init:
            return dist
    return None


def test_version_is_a_release_number():
    assert isinstance(jax_dash.__version__, str)
    assert _RELEASE.fullmatch(jax_dash.__version__), jax_dash.__version__
    assert jax_dash.__version__ == _version.__version__


def test_bits_version_is_exposed_and_well_formed():
    bits = jax_dash.BITS_VERSION
    assert bits is _version.BITS_VERSION
    assert bits._fields == ("forward", "backward")
    assert all(type(v) is int and v >= 1 for v in bits), bits
    # docs/determinism.md: "Forward bits version 2".
    assert bits.forward >= 2


def test_installed_metadata_matches_the_package():
    dist = _installed_distribution()
    if dist is None:
        pytest.skip("jax_dash is imported from a checkout or an editable install, not from an "
                    "installed wheel: its metadata may be older than this code")
    assert importlib.metadata.version("jax_dash") == jax_dash.__version__


def test_py_typed_ships_in_the_package():
    package_dir = pathlib.Path(jax_dash.__file__).parent
    assert (package_dir / "py.typed").is_file()
    dist = _installed_distribution()
    if dist is not None:  # an installed wheel lists it in its RECORD
        assert "jax_dash/py.typed" in {f.as_posix() for f in dist.files}

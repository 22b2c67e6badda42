"""colibri.codegen: checkpoint import, numpy reference, quantisation, layout and C emission."""

import re
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path


def _version() -> str:
    """pyproject.toml's version: from the installed package's metadata, else from the file itself."""
    try:
        return version("colibri")
    except PackageNotFoundError:  # a checkout used without installing it
        pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
        m = re.search(r'^version = "([^"]+)"', pyproject.read_text(), re.M) if pyproject.is_file() else None
        return m.group(1) if m else "0"


__version__ = _version()

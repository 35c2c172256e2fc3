"""A plain (non-editable) install ships every subpackage and data file the code needs."""

from __future__ import annotations

import tomllib

from conftest import ROOT


def test_every_subpackage_is_listed_for_installation():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    found = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for p in (ROOT / "orcasim").rglob("__init__.py")
    }
    assert found - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
    assert config["package-dir"]["orcasim.scenarios"] == "scenarios"
    data = config["package-data"]
    assert "*.yaml" in data["orcasim.scenarios"]
    shipped = {str(p.relative_to(ROOT / "orcasim")) for p in (ROOT / "orcasim" / "data").rglob("*")
               if p.is_file()}
    patterns = data["orcasim"]
    import fnmatch

    missing = {f for f in shipped if not any(fnmatch.fnmatch(f, pat) for pat in patterns)}
    assert missing == set(), "add these data files to package-data in pyproject.toml"

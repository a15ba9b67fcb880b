"""The strategies package is where a student starts reading: every package says what it holds,
which lab teaches it and where its prediction lives, and names every file it has."""

import ast
import re
from pathlib import Path

import pytest

STRATEGIES = Path(__file__).resolve().parents[1] / "plscale" / "strategies"
PACKAGES = sorted(p for p in STRATEGIES.iterdir() if (p / "__init__.py").is_file())


def docstring(package: Path) -> str:
    return ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""


def test_every_strategy_package_is_listed_at_the_top():
    top = docstring(STRATEGIES)
    missing = [p.name for p in PACKAGES if not re.search(rf"^\s*{p.name}/", top, re.M)]
    assert PACKAGES and not missing, f"plscale/strategies/__init__.py does not list: {missing}"


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.name)
def test_a_package_names_its_files_its_lab_and_its_prediction(package):
    doc = docstring(package)
    unnamed = [f.name for f in sorted(package.glob("*.py")) if f.name != "__init__.py" and f.name not in doc]
    assert not unnamed, f"{package.name}/__init__.py's docstring does not name {unnamed}"
    assert re.search(r"\blabs? \d\d", doc, re.I), f"{package.name}: its docstring names no lab"
    assert "plscale/predict/" in doc, f"{package.name}: its docstring names no prediction module"

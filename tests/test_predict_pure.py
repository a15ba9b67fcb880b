"""plscale.predict is pure and speaks no CLI: it imports no torch, matplotlib, deepspeed or the
layers above it, its messages name quantities, never flags, and the CLI words them as the flags
the user typed."""

import ast
import re
from pathlib import Path

import pytest

from plscale.predict.errors import PredictionError
from plscale.predict.grid import Layout
from plscale.predict.setup import Setup

PREDICT = Path(__file__).resolve().parents[1] / "plscale" / "predict"
FORBIDDEN = ("torch", "matplotlib", "deepspeed", "jax", "plscale.run", "plscale.lab", "plscale.cli", "plscale.rank",
             "plscale.strategies", "plscale.charts")
FLAG = re.compile(r"(?<![\w-])--[a-z]")


def _sources():
    files = sorted(PREDICT.glob("*.py"))
    assert len(files) > 15
    return [(path, ast.parse(path.read_text(), str(path))) for path in files]


def _imports(tree) -> list[str]:
    """Every module imported anywhere in the file: top level, in functions, under TYPE_CHECKING."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            out += [base] + [f"{base}.{alias.name}" for alias in node.names]
    return out


def _docstrings(tree) -> set[int]:
    nodes = [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))]
    return {id(n.body[0].value) for n in nodes
            if n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}


def test_predict_imports_nothing_impure():
    found = [f"{path.name}: {name}" for path, tree in _sources() for name in _imports(tree)
             if any(name == bad or name.startswith(bad + ".") for bad in FORBIDDEN)]
    assert found == []


def test_predict_modules_import_each_other_without_a_cycle():
    graph = {path.stem: {name.split(".")[2] for name in _imports(tree) if name.startswith("plscale.predict.")}
             for path, tree in _sources()}
    done, path = set(), []

    def visit(module):
        assert module not in path, f"import cycle: {' -> '.join([*path, module])}"
        if module in done:
            return
        path.append(module)
        for other in graph.get(module, ()):
            visit(other)
        path.pop()
        done.add(module)

    for module in graph:
        visit(module)
    assert "memory" not in graph["activations"] and "activations" not in graph["setup"]


def test_no_message_in_predict_names_a_cli_flag():
    """Messages (every string but docstrings, f-strings' pieces included) name quantities, not flags."""
    found = []
    for path, tree in _sources():
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs \
                    and FLAG.search(node.value):
                found.append(f"{path.name}:{node.lineno}: {node.value!r}")
    assert found == []


def test_the_flag_pattern_finds_flags():
    assert FLAG.search("use --seq 4") and FLAG.search("--gpus 4") and not FLAG.search("2 -- b") \
        and not FLAG.search("x---y")


def test_a_prediction_error_carries_the_quantity_and_words_it_as_asked():
    with pytest.raises(PredictionError) as error:
        Setup(params=1, seq=100, cp=3).validate()
    exc = error.value
    assert (exc.quantity, exc.value) == ("seq", 100)
    assert str(exc) == "seq 100 does not split over cp 3 ranks: use a multiple of 3."
    assert str(exc.named({"seq": "model.seq", "cp": "parallel.cp"})) == \
        "model.seq 100 does not split over parallel.cp 3 ranks: use a multiple of 3."
    assert exc.named(str.upper).quantity == "seq" and exc.exit_code == 2
    with pytest.raises(PredictionError) as error:
        Layout(0)
    assert (error.value.quantity, error.value.value) == ("gpus", 0)
    with pytest.raises(PredictionError) as error:
        Layout(8, ep=3)
    assert error.value.quantity == "ep" and "--" not in str(error.value)


@pytest.mark.parametrize("args, line", [
    (("estimate", "memory", "--seq", "100", "--cp", "3", "--gpus", "3"),
     "error: --seq 100 does not split over --cp 3 ranks: use a multiple of 3."),
    (("estimate", "memory", "--model", "small", "--sp"),
     "error: --sp: sequence parallelism needs tp >= 2: raise --tp or drop --sp."),
    (("plan", "--model", "7b", "--gpus", "0"), "error: --gpus 0: must be at least 1."),
    (("plan", "--model", "7b", "--gpus", "64", "--gpus-per-node", "3"),
     "error: --gpus 64 is not a whole number of 3-GPU nodes: use a multiple of 3 (or set --gpus-per-node)."),
    (("mesh", "--gpus", "6", "--tp", "4"), "error: --gpus 6 is not a multiple of tp 4 x pp 1 x cp 1 = 4: use --gpus 4 or 8."),
    (("estimate", "moe", "-m", "small", "--top-k", "3"), "error: --top-k 3: use 1 or 2"),
])
def test_the_cli_names_the_flag_the_user_typed(quick_cli, args, line):
    out = quick_cli(*args)
    assert out.returncode == 2, out.stdout
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(line), out.stderr

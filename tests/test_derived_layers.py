"""Derived layer tables: `detaudit calibrate --modules` traces a package's layers,
the static pass reports what they run and counts what they draw."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from detaudit.knowledge.layers import SHIPPED_DIR, LayerTableError, load_layer_table, parse_layer_table
from detaudit.knowledge.ops import load_ops_table

# A tiny third-party package: a layer that scatter-adds messages and initialises
# weights, a pooling function, a layer that draws only when called, and one whose
# constructor takes an argument nobody can guess.
TINY_PACKAGE = {
    "tinygnn/__init__.py": '__version__ = "0.3.1"\n',
    "tinygnn/nn/__init__.py": "from .layers import *\n",
    "tinygnn/nn/layers.py": '''
        import torch

        __all__ = ["SumConv", "sum_pool", "NoisyIdentity", "Configured", "Plain"]


        class SumConv(torch.nn.Module):
            def __init__(self, in_channels: int, out_channels: int):
                super().__init__()
                self.lin = torch.nn.Linear(in_channels, out_channels)

            def forward(self, x, edge_index):
                out = torch.zeros_like(x)
                out.index_add_(0, edge_index[1], x[edge_index[0]])
                return self.lin(out)


        def sum_pool(x, batch):
            out = torch.zeros(int(batch.max()) + 1, x.shape[1])
            return out.scatter_add(0, batch.unsqueeze(1).expand_as(x), x)


        class NoisyIdentity(torch.nn.Module):
            def forward(self, x):
                return x + torch.randn_like(x)


        class Configured(torch.nn.Module):
            def __init__(self, config: dict):
                super().__init__()


        class Plain(torch.nn.Module):
            def forward(self, x):
                return x * 2
    ''',
}


def _run(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "detaudit", *args], cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def tiny_table(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tinygnn")
    for relative, text in TINY_PACKAGE.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    output = root / "tables" / "tinygnn.json"
    output.parent.mkdir()
    env = {"PYTHONPATH": os.pathsep.join([str(root), str(Path(__file__).resolve().parents[1])])}
    result = _run(["calibrate", "--modules", "tinygnn.nn", "--output", str(output)], root, env)
    assert result.returncode == 0, result.stderr
    assert "5 layers of tinygnn 0.3.1, 4 traced, 2 reach nondeterministic ops" in result.stdout
    return output


def test_calibrate_modules_derives_ops_and_draws_of_each_layer(tiny_table):
    table = load_layer_table(tiny_table)
    assert (table.package, table.package_version, table.modules) == ("tinygnn", "0.3.1", ("tinygnn.nn",))
    layers = {layer.name.rpartition(".")[2]: layer for layer in table.layers}
    # index_add_ forward, and the backward of x[edge_index[0]] (an accumulating index_put)
    assert {"index_add", "index_put-accumulate"} <= set(layers["SumConv"].ops)
    assert layers["SumConv"].draws == ("construction",)
    assert layers["SumConv"].defined_in == "tinygnn.nn.layers"
    assert layers["sum_pool"].ops[0] == "scatter_add" and layers["sum_pool"].kind == "function"
    assert layers["NoisyIdentity"].draws == ("call",) and layers["NoisyIdentity"].ops == ()
    assert layers["Plain"].traced and layers["Plain"].ops == () and layers["Plain"].draws == ()
    assert not layers["Configured"].traced


def test_check_reports_layers_from_a_derived_table(tiny_table, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\nfrom tinygnn.nn import SumConv, Plain\nfrom tinygnn.nn.layers import sum_pool\n\n"
        "class Net(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.conv = SumConv(4, 4)\n        self.scale = Plain()\n\n"
        "    def forward(self, x, edge_index, batch):\n        return sum_pool(self.conv(x, edge_index), batch)\n\n"
        "model = Net()\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\nmodel(x, edges, batch).sum().backward()\n"
    )
    result = _run(["check", "--no-cache", "--no-config", "--format", "json", "--select", "DET020,DET001", str(script)], tmp_path,
                  {"DETAUDIT_LAYER_TABLES": str(tiny_table.parent)})
    findings = json.loads(result.stdout)["findings"]
    by_line = {(f["line"], f["name"]): f["message"] for f in findings}
    assert "derived from tinygnn 0.3.1" in by_line[(8, "nondeterministic-op")]
    assert "tinygnn.nn.SumConv" in by_line[(8, "nondeterministic-op")]
    assert "tinygnn.nn.sum_pool" in by_line[(12, "nondeterministic-op")]  # found through its defining module's name
    assert "tinygnn.nn.SumConv" in by_line[(14, "missing-torch-seed")]  # its construction draws
    assert not any(line == 9 for line, _ in by_line)

    without = _run(["check", "--no-cache", "--no-config", "--format", "json", "--select", "DET020", str(script)], tmp_path)
    assert json.loads(without.stdout)["findings"] == []


def test_a_bad_layer_table_is_a_one_line_usage_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema_version": 1}')
    (tmp_path / "t.py").write_text("import torch\n")
    result = _run(["check", "--no-cache", "--no-config", "t.py"], tmp_path, {"DETAUDIT_LAYER_TABLES": str(bad)})
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].endswith("bad layer table " + str(bad) + ": top level: missing key 'layers'")


def test_calibrate_modules_refuses_a_module_that_is_not_installed(tmp_path):
    result = _run(["calibrate", "--modules", "no_such_package_here.nn"], tmp_path)
    assert result.returncode == 2 and "no installed module 'no_such_package_here.nn'" in result.stderr


# -- the shipped tables ------------------------------------------------------------------


SHIPPED = sorted(SHIPPED_DIR.glob("*.json"))


def test_tables_are_shipped_for_torch_geometric():
    assert [path.stem for path in SHIPPED] == ["torch_geometric"]


@pytest.mark.parametrize("path", SHIPPED, ids=[path.stem for path in SHIPPED])
def test_shipped_tables_name_entries_of_the_ops_table(path):
    table = load_layer_table(path)
    ops = load_ops_table()
    assert table.package == path.stem and table.package_version[0].isdigit()
    for layer in table.layers:
        assert all(ops.entry(entry_id) is not None for entry_id in layer.ops), layer.name
        assert layer.defined_in.startswith(f"{table.package}.")


def test_shipped_pyg_table_has_the_message_passing_layers():
    table = {layer.name: layer for layer in load_layer_table(SHIPPED_DIR / "torch_geometric.json").layers}
    for name in ("GCNConv", "GINConv", "SAGEConv", "GATConv", "GraphConv", "GIN", "GraphSAGE", "global_add_pool", "global_mean_pool"):
        assert "scatter_add" in table[f"torch_geometric.nn.{name}"].ops, name
    assert "construction" in table["torch_geometric.nn.GCNConv"].draws


def _document() -> dict:
    return json.loads((SHIPPED_DIR / "torch_geometric.json").read_text())


def _layer(document: dict) -> dict:
    return document["layers"]["torch_geometric.nn.GCNConv"]


BROKEN = [
    ("not an object", lambda d: [], "top level: expected an object"),
    ("unknown key", lambda d: d | {"comment": 1}, "top level: unknown key 'comment'"),
    ("newer schema", lambda d: d | {"schema_version": 2}, "schema_version: expected an integer from 1 to 1"),
    ("layers a list", lambda d: d | {"layers": []}, "layers: expected an object"),
    ("layer of another package", lambda d: d | {"layers": {"dgl.nn.GraphConv": _layer(d)}}, "layers.dgl.nn.GraphConv: not a name in package"),
    ("layer without draws", lambda d: d | {"layers": {"torch_geometric.nn.X": {k: v for k, v in _layer(d).items() if k != "draws"}}},
     "layers.torch_geometric.nn.X: expected an object with keys"),
    ("unknown draw phase", lambda d: d | {"layers": {"torch_geometric.nn.X": _layer(d) | {"draws": ["import"]}}},
     "layers.torch_geometric.nn.X.draws[0]: 'import' is not one of construction, call"),
    ("unknown kind", lambda d: d | {"layers": {"torch_geometric.nn.X": _layer(d) | {"kind": "method"}}},
     "layers.torch_geometric.nn.X.kind: 'method' is not one of class, function"),
    ("traced a string", lambda d: d | {"layers": {"torch_geometric.nn.X": _layer(d) | {"traced": "yes"}}},
     "layers.torch_geometric.nn.X.traced: expected true or false"),
]  # fmt: skip


@pytest.mark.parametrize("label, change, expected", BROKEN, ids=[case[0] for case in BROKEN])
def test_broken_layer_tables_name_the_problem(label, change, expected):
    with pytest.raises(LayerTableError) as raised:
        parse_layer_table(change(_document()), "t.json")
    assert str(raised.value).startswith(f"bad layer table t.json: {expected}")

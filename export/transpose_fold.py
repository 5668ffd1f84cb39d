"""Transpose(W) feeding a MatMul, as torch's exporter writes nn.Linear, folded into W^T.

The quantisers (linear_quant.py) and TensorRT's weight-only path need the weight itself as the
MatMul's B input [K, N], not a Transpose of an [N, K] initializer. The folded weight is lazy
(graph_edit.py): it is transposed when the graph is written, one tensor at a time. It is made
as a transposed view of the weight: the quantisers work one output channel (a row of the
original) at a time, and the writer lays out whatever it stores (graph_edit.materialize), so
the transposing copy is made once, where one is needed, or never.
"""

from __future__ import annotations

from .graph_edit import EditableGraph


def fold_weight_transposes(g: EditableGraph) -> int:
    """Replaces every 2-D initializer's [1, 0] Transpose by one transposed initializer.
    Returns how many were folded."""
    keep, folded = [], 0
    renames: dict[str, str] = {}  # the Transpose's output -> the folded initializer
    for node in g.graph.node:
        w = node.input[0] if node.op_type == "Transpose" else None
        perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), [1, 0])
        if w in g.inits and len(g.inits[w].dims) == 2 and perm == [1, 0]:
            name = g.fresh(f"{w}.T")
            source = g.loader(w)
            g.put_lazy(name, g.inits[w].data_type, list(g.inits[w].dims)[::-1],
                       lambda source=source: source().T)  # a view: see the module docstring
            renames[node.output[0]] = name
            folded += 1
            continue
        keep.append(node)
    for node in keep:
        for i, n in enumerate(node.input):
            if n in renames:
                node.input[i] = renames[n]
    g.replace_nodes(keep)
    g.drop_unused()
    return folded

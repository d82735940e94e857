"""The typed document graph: `DocGraph` stored as columns (`core`), its per-row views (`views`),
attr columns (`columns`), dict and networkx conversions (`interchange`) and depths in a parent
array (`forest`)."""

from graphattn.graph.core import CONTAINS, DocGraph
from graphattn.graph.views import Edge, EdgesView, EdgeView, Node, NodesView, NodeView

__all__ = ["CONTAINS", "DocGraph", "Edge", "EdgeView", "EdgesView", "Node", "NodeView", "NodesView"]

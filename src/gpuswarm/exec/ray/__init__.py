"""The ``ray`` backend (issue 16): slot actors on every GPU of a Ray cluster (docs/cluster.md).

Only :mod:`gpuswarm.exec.base`'s registry imports this package, and only for ``backend: ray``;
``ray`` itself is imported lazily (a local run never loads it).
"""

"""The layer's core: what the composed layer computes without I/O.

- :mod:`durabilis.core.layer.types`: the context ``fn`` is handed, the
  fleet's totals (``LayerStats``), the codes the layer writes.
"""

"""The speculative runtime: safe loading, drafters, the pure acceptance rule, the decode loop
with KV-cache rollback, metrics and the choice of k. It knows nothing about the registry or the
validators; it may import ``specreg.core`` and ``specreg.errors``.

Import the pieces from their modules (``specreg.runtime.decode`` ...): this package imports no
torch at import time, so that light commands stay light.
"""

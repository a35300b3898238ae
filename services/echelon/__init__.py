"""Echelon: a content-based publish/subscribe cluster.

The import package `echelon` is this `services/echelon/` folder: `core/` holds the pure
algorithms, `runtime/` the shared service plumbing, and one folder per service.
"""

__version__ = "0.1.0"

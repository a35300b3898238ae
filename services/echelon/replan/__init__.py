"""The routing job (Kyra): metrics in, a RoutingPlan out through Control (docs/papers.md, "Kyra").

`spark-submit spark/main.py` or `echelon replan` runs it; the transforms are pure DataFrame code.
"""

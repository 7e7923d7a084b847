"""Course tooling: benchmarks, lecture visuals and widgets, training, model cards, golden data, the GPU check.

Nothing on the request path imports this package (an import-linter contract in pyproject.toml checks it).
"""

"""The one thing pyproject.toml cannot say: the compiled hot path, built only when asked.

`services/echelon/runtime/_fill.c` (docs/performance.md, "A compiled hot path") is built by
`pip install` where a C compiler is; `optional`: without one the install goes on and
runtime/schema_code.py runs its Python reference. ECHELON_PURE=1 builds without it: the
wheel of `make dist` is then pure Python (py3-none-any), for any platform.
"""

import os

from setuptools import Extension, setup

PURE = os.environ.get("ECHELON_PURE", "") not in ("", "0")
setup(ext_modules=[] if PURE else [Extension("echelon.runtime._fill", ["services/echelon/runtime/_fill.c"],
                                             optional=True)])

"""The one build step that setup.cfg cannot declare: the type marker of each module.

Every module here is a single file (`py_modules`), and PEP 561 puts the ``py.typed``
marker in a package's directory, so a single-file module cannot carry one. mypy looks for
the marker of an installed module ``m`` at ``site-packages/m/py.typed``; Python imports
``m.py`` before a directory ``m`` that has no ``__init__.py``. So the wheel holds, beside
each ``m.py``, a directory ``m`` holding only an empty ``py.typed``: ``import m`` is the
module, and mypy reads its annotations. The markers follow ``py_modules``, so a module
added there gets one.
"""

from __future__ import annotations

import os
from typing import List

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildWithTypeMarkers(build_py):
    """build_py that also writes ``m/py.typed`` for each module ``m`` of py_modules."""

    def markers(self) -> List[str]:
        """The marker files, under the build directory."""
        return [os.path.join(self.build_lib, name, "py.typed") for name in self.py_modules or []]

    def run(self) -> None:
        super().run()
        for marker in self.markers():
            os.makedirs(os.path.dirname(marker), exist_ok=True)
            with open(marker, "w", encoding="utf-8"):
                pass  # empty: the marker says "typed", for the whole module

    def get_outputs(self, include_bytecode: bool = True) -> List[str]:
        return [*super().get_outputs(include_bytecode), *self.markers()]


setup(cmdclass={"build_py": BuildWithTypeMarkers})

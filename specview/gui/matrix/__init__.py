"""The Matrix tab: a reproducer matrix as a colour-coded grid, its divergence rates, its run dialog, and running it on
the worker."""

from .dialog import MatrixDialog, matrix_choices, matrix_spec
from .rates import RatesPanel
from .tab import MatrixTab, is_matrix_file
from .view import MatrixView

__all__ = ["MatrixDialog", "MatrixTab", "MatrixView", "RatesPanel", "is_matrix_file", "matrix_choices",
           "matrix_spec"]

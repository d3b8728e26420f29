"""The Kernel map tab: which verify widths compute exactly what single-token passes compute, and the prescription."""

from .tab import TAB_TIP, KernelTab, is_kernel_map_file, map_verdict
from .view import KernelMapView
from .words import cell_look, row_claim

__all__ = ["TAB_TIP", "KernelMapView", "KernelTab", "cell_look", "is_kernel_map_file", "map_verdict", "row_claim"]

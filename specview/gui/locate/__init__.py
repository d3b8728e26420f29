"""The Locate tab: |Δ| of every graph node between the single-token pass and a batched verify row."""

from .plot import LocatePlot
from ..verdict_bar import LOCATE_LINK
from .tab import TAB_TIP, LocateTab, departure_of, is_locate_file, locate_link

__all__ = ["LOCATE_LINK", "TAB_TIP", "LocatePlot", "LocateTab", "departure_of", "is_locate_file", "locate_link"]

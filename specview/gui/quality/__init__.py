"""The Quality tab: a task suite through both arms, whether a fork ever changes an answer, and each item's trace."""

from .confirm import ExecuteConfirm, sandbox_lines
from .tab import TAB_TIP, QualityTab, is_quality_file
from .tables import ItemsTable, OutcomeTable

__all__ = ["ExecuteConfirm", "ItemsTable", "OutcomeTable", "QualityTab", "TAB_TIP", "is_quality_file",
           "sandbox_lines"]

"""The desktop app: PySide6 widgets and pyqtgraph plots over the same core objects the CLI drives.

Nothing under :mod:`specview.core` or :mod:`specview.backends` imports this package.
"""

from .qtcompat import guard as _guard

_guard()

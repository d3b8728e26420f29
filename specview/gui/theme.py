"""Colour themes: the system's, or specview's own light and dark palettes on the Fusion style."""

from __future__ import annotations

from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QApplication, QStyleFactory

THEMES = ("system", "light", "dark")


def dark_palette() -> QPalette:
    p = QPalette()
    C = QPalette.ColorRole
    window, base, text = QColor(37, 39, 43), QColor(27, 29, 32), QColor(222, 224, 228)
    p.setColor(C.Window, window)
    p.setColor(C.WindowText, text)
    p.setColor(C.Base, base)
    p.setColor(C.AlternateBase, QColor(45, 47, 52))
    p.setColor(C.ToolTipBase, QColor(50, 52, 58))
    p.setColor(C.ToolTipText, text)
    p.setColor(C.PlaceholderText, QColor(140, 142, 148))
    p.setColor(C.Text, text)
    p.setColor(C.Button, QColor(50, 52, 58))
    p.setColor(C.ButtonText, text)
    p.setColor(C.BrightText, QColor(255, 90, 90))
    p.setColor(C.Link, QColor(110, 170, 255))
    p.setColor(C.Highlight, QColor(60, 120, 215))
    p.setColor(C.HighlightedText, QColor(255, 255, 255))
    for role in (C.Text, C.ButtonText, C.WindowText):
        p.setColor(QPalette.ColorGroup.Disabled, role, QColor(120, 122, 128))
    return p


def light_palette() -> QPalette:
    p = QPalette()
    C = QPalette.ColorRole
    p.setColor(C.Window, QColor(239, 240, 242))
    p.setColor(C.WindowText, QColor(20, 22, 25))
    p.setColor(C.Base, QColor(255, 255, 255))
    p.setColor(C.AlternateBase, QColor(245, 246, 248))
    p.setColor(C.ToolTipBase, QColor(255, 255, 235))
    p.setColor(C.ToolTipText, QColor(20, 22, 25))
    p.setColor(C.Text, QColor(20, 22, 25))
    p.setColor(C.Button, QColor(232, 233, 236))
    p.setColor(C.ButtonText, QColor(20, 22, 25))
    p.setColor(C.Highlight, QColor(48, 110, 210))
    p.setColor(C.HighlightedText, QColor(255, 255, 255))
    p.setColor(C.Link, QColor(30, 90, 200))
    p.setColor(C.PlaceholderText, QColor(128, 130, 136))
    for role in (C.Text, C.ButtonText, C.WindowText):  # a disabled control must look disabled
        p.setColor(QPalette.ColorGroup.Disabled, role, QColor(150, 152, 158))
    return p


def apply_theme(name: str) -> str:
    """Give the application the theme ``name`` (unknown names mean "system"); return the name applied."""
    if name not in THEMES:
        name = "system"
    app = QApplication.instance()
    if app is None:
        return name
    if name == "dark":
        app.setStyle(QStyleFactory.create("Fusion"))
        app.setPalette(dark_palette())
    elif name == "light":
        app.setStyle(QStyleFactory.create("Fusion"))
        app.setPalette(light_palette())
    else:
        app.setPalette(app.style().standardPalette())
    return name

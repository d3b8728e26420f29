"""The one QApplication of the process, on screen or offscreen.

The desktop app, the report plots (``specview report`` draws them with the
app's own plot widgets) and the tests all get their application here.  Without
a display (no ``DISPLAY`` / ``WAYLAND_DISPLAY`` on Linux) or when asked for it,
the application runs on Qt's ``offscreen`` platform: widgets are laid out and
painted into images, never shown.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Callable

from .qtcompat import guard

APP_NAME = "specview"
DESKTOP_ID = "io.github.specview.specview"


def _no_display() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    return not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


#: the Debian and Ubuntu package of each library Qt's X11 platform plugin needs that a minimal system lacks
XCB_PACKAGES = {
    "libxcb-cursor.so.0": "libxcb-cursor0", "libxkbcommon-x11.so.0": "libxkbcommon-x11-0",
    "libxkbcommon.so.0": "libxkbcommon0", "libxcb-icccm.so.4": "libxcb-icccm4", "libxcb-util.so.1": "libxcb-util1",
    "libxcb-image.so.0": "libxcb-image0", "libxcb-keysyms.so.1": "libxcb-keysyms1",
    "libxcb-render-util.so.0": "libxcb-render-util0", "libxcb-shape.so.0": "libxcb-shape0",
    "libxcb-xinerama.so.0": "libxcb-xinerama0", "libxcb-xkb.so.1": "libxcb-xkb1", "libX11-xcb.so.1": "libx11-xcb1",
    "libGL.so.1": "libgl1", "libEGL.so.1": "libegl1", "libfontconfig.so.1": "libfontconfig1",
    "libdbus-1.so.3": "libdbus-1-3",
}


def xcb_plugin() -> Path | None:
    """Qt's X11 platform plugin in this PySide6 (``Qt/plugins/platforms/libqxcb.so``), or None."""
    try:
        import PySide6
    except ImportError:
        return None
    p = Path(PySide6.__file__).parent / "Qt" / "plugins" / "platforms" / "libqxcb.so"
    return p if p.exists() else None


def window_problem() -> str | None:
    """Why the app's window cannot be shown here, said so that a user can act on it (None: it can be).

    On Linux with neither ``DISPLAY`` nor ``WAYLAND_DISPLAY`` (a server, a container, ssh without ``-X``) Qt would
    run the app on its offscreen platform: a window nobody can see or close, and a command that never returns.
    ``QT_QPA_PLATFORM`` set by the user (``offscreen`` for a headless check) is their choice and stands."""
    if not _no_display() or os.environ.get("QT_QPA_PLATFORM"):
        return None
    return ("no display to open the window on: neither DISPLAY nor WAYLAND_DISPLAY is set (a server, a container, "
            "or ssh without -X). Open the app on a desktop or over `ssh -X`, or use the command line, which needs "
            "no display: `specview run` runs both arms and prints the verdict, `specview report` writes it as "
            "HTML (QT_QPA_PLATFORM=offscreen starts the app with no window at all)")


def _wants_xcb() -> bool:
    """Whether Qt will open its X11 platform here: asked for by name, or an X display without a Wayland one."""
    asked = os.environ.get("QT_QPA_PLATFORM", "")
    if asked:
        return asked.split(";")[0].split(":")[0] == "xcb"
    return sys.platform.startswith("linux") and bool(os.environ.get("DISPLAY")) and \
        not os.environ.get("WAYLAND_DISPLAY")


def platform_problem(plugin: Path | None = None) -> str | None:
    """Why Qt's X11 platform plugin cannot load on this system (a system library it needs is missing), said so that
    a user can fix it; None where it loads.  Qt itself would print a hint and abort the process: this is asked
    first, so that ``specview gui`` ends with an error that names the library and its package instead."""
    import ctypes

    plugin = plugin or xcb_plugin()
    if plugin is None:
        return None
    try:
        ctypes.CDLL(str(plugin), mode=getattr(os, "RTLD_LOCAL", 0) | getattr(os, "RTLD_LAZY", 1))
    except OSError as exc:
        why = str(exc)
        lib = why.split(":", 1)[0].strip()
        pkg = XCB_PACKAGES.get(lib)
        if lib.startswith("libQt6") or lib.startswith("libpyside6") or lib.startswith("libshiboken6"):
            fix = "PySide6's own files are incomplete: reinstall it (`pip install --force-reinstall PySide6-Essentials`)"
        elif pkg:
            fix = f"Install it (Debian and Ubuntu: `apt-get install {pkg}`; elsewhere the package that provides {lib})"
        else:
            fix = f"Install the system package that provides {lib}"
        return (f"Qt's X11 platform plugin ({plugin}) cannot load: {why}. {fix}, or use specview's CLI, which needs "
                "no display")
    return None


def reach_display() -> tuple[str | None, Callable[[], None]]:
    """Whether an X display answers at ``$DISPLAY``: (why not, said so that a user can fix it, or None; a function
    that closes the connection made to ask).  Qt would print a line and abort the process where none answers.

    The connection is to be closed only once Qt holds its own: an X server such as Xvfb resets when its last
    client leaves, and refuses connections while it does."""
    import ctypes

    try:
        xcb = ctypes.CDLL("libxcb.so.1")
    except OSError:
        return None, lambda: None  # the plugin's own check names what is missing
    xcb.xcb_connect.restype = ctypes.c_void_p
    xcb.xcb_connect.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
    xcb.xcb_connection_has_error.argtypes = [ctypes.c_void_p]
    xcb.xcb_disconnect.argtypes = [ctypes.c_void_p]
    conn = xcb.xcb_connect(None, None)
    err = xcb.xcb_connection_has_error(conn) if conn else 1

    def close() -> None:
        if conn:
            xcb.xcb_disconnect(conn)

    if not err:
        return None, close
    close()
    display = os.environ.get("DISPLAY", "")
    return (f"cannot reach the X display DISPLAY={display!r} (xcb error {err}): no X server answers there, or it "
            "refuses this user. Check DISPLAY (over ssh, `ssh -X`), or use specview's CLI, which needs no display "
            "(the app draws offscreen with QT_QPA_PLATFORM=offscreen)"), lambda: None


def application(*, offscreen: bool = False, argv: list[str] | None = None):
    """The running QApplication, or a new one (offscreen when asked for, or when there is no display)."""
    guard()
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance()
    if app is not None:
        return app
    if (offscreen or _no_display()) and not os.environ.get("QT_QPA_PLATFORM"):
        os.environ["QT_QPA_PLATFORM"] = "offscreen"
    release: Callable[[], None] = lambda: None
    if _wants_xcb():
        problem = platform_problem()
        if problem is None:
            problem, release = reach_display()
        if problem:
            from ..core.errors import SpecviewError

            raise SpecviewError(problem)
    try:
        app = QApplication(list(argv) if argv else [APP_NAME])
    finally:
        release()
    app.setApplicationName(APP_NAME)
    app.setOrganizationName(APP_NAME)
    app.setDesktopFileName(DESKTOP_ID)
    return app

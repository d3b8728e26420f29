"""A system that lacks a library Qt's X11 platform plugin needs (a minimal Debian has no libxcb-cursor0) gets an
error from ``specview gui`` that names the library and its package, never Qt's abort of the process."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from specview.gui import app

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Qt's X11 plugin is Linux's")


def plugin_needing(tmp_path: Path, soname: str) -> Path:
    """A shared library that needs ``soname`` (built against a stub of it, then the stub removed): loading it fails
    as Qt's X11 plugin fails where that library is not installed."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.fail("no C compiler (cc, gcc) to build the test's plugin: install gcc")
    stub_dir = tmp_path / "stub"
    stub_dir.mkdir()
    (tmp_path / "stub.c").write_text("int stub_symbol(void) { return 1; }\n")
    (tmp_path / "plugin.c").write_text("int stub_symbol(void);\nint plugin_entry(void) { return stub_symbol(); }\n")
    subprocess.run([cc, "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(stub_dir / soname),
                    str(tmp_path / "stub.c")], check=True)
    plugin = tmp_path / "platforms" / "libqxcb.so"
    plugin.parent.mkdir()
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(plugin), str(tmp_path / "plugin.c"), str(stub_dir / soname)],
                   check=True)
    shutil.rmtree(stub_dir)
    return plugin


#: a library no system has, standing for libxcb-cursor.so.0 (which this machine may have installed)
MISSING = "libspecview-xcb-cursor.so.0"


@pytest.fixture
def packaged(monkeypatch):
    monkeypatch.setitem(app.XCB_PACKAGES, MISSING, "libspecview-xcb-cursor0")


def test_a_missing_system_library_is_named_with_its_package(tmp_path, packaged):
    problem = app.platform_problem(plugin_needing(tmp_path, MISSING))
    assert problem is not None
    assert f"{MISSING}: cannot open shared object file" in problem
    assert "`apt-get install libspecview-xcb-cursor0`" in problem and "specview's CLI" in problem
    assert app.XCB_PACKAGES["libxcb-cursor.so.0"] == "libxcb-cursor0"  # Qt 6.5+'s usual gap on a minimal Debian


def test_an_unknown_library_still_says_what_to_install(tmp_path):
    problem = app.platform_problem(plugin_needing(tmp_path, "libspecview-nowhere.so.7"))
    assert "libspecview-nowhere.so.7" in problem and "Install the system package that provides" in problem


def test_the_installed_plugin_loads_where_its_libraries_are_installed():
    """This machine's own plugin: it loads, or the problem names what is missing (never a crash)."""
    plugin = app.xcb_plugin()
    if plugin is None:
        pytest.skip("this PySide6 has no X11 platform plugin")
    problem = app.platform_problem(plugin)
    assert problem is None or "cannot load:" in problem


def test_specview_gui_ends_with_the_error_not_an_abort(tmp_path):
    """On an X display with the plugin's library missing, ``specview gui`` exits 2 with one error, before Qt
    starts (Qt would print its hint and abort the process with SIGABRT)."""
    plugin = plugin_needing(tmp_path, MISSING)
    code = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from specview.gui import app
        app.XCB_PACKAGES[{MISSING!r}] = "libspecview-xcb-cursor0"
        app.xcb_plugin = lambda: Path({str(plugin)!r})
        from specview.cli import main
        sys.exit(main(["gui", "--fresh", "--no-preload"]))
    """)
    env = {**os.environ, "DISPLAY": ":97", "QT_QPA_PLATFORM": "xcb", "SPECVIEW_CONFIG_DIR": str(tmp_path / "config")}
    env.pop("WAYLAND_DISPLAY", None)
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, (res.returncode, res.stderr[-2000:])
    assert "specview: error: Qt's X11 platform plugin" in res.stderr
    assert "apt-get install libspecview-xcb-cursor0" in res.stderr and "Traceback" not in res.stderr


def test_specview_gui_on_a_display_no_x_server_answers_ends_with_the_error(tmp_path):
    """DISPLAY names a display no X server serves (a stale one after a logout, a wrong number): ``specview gui``
    exits 2 naming DISPLAY, where Qt would abort the process (on a machine that also lacks a library of Qt's X11
    plugin, that comes first, and is named)."""
    expect = ("specview: error: Qt's X11 platform plugin" if app.platform_problem() is not None else
              "specview: error: cannot reach the X display DISPLAY=':97'")
    env = {**os.environ, "DISPLAY": ":97", "QT_QPA_PLATFORM": "xcb", "SPECVIEW_CONFIG_DIR": str(tmp_path / "config")}
    env.pop("WAYLAND_DISPLAY", None)
    res = subprocess.run([sys.executable, "-m", "specview", "gui", "--fresh", "--no-preload"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, (res.returncode, res.stderr[-2000:])
    assert expect in res.stderr and "Traceback" not in res.stderr


@pytest.mark.parametrize("argv", [["gui", "--fresh", "--no-preload"], []], ids=["gui", "bare"])
def test_with_no_display_at_all_the_app_says_so_instead_of_running_unseen(tmp_path, argv):
    """No DISPLAY and no WAYLAND_DISPLAY (ssh without -X, a server): Qt would run the window on its offscreen
    platform, where nobody can see or close it, and the command would never return. ``specview gui`` (and bare
    ``specview``, which opens the app) exits 2 saying so and naming the CLI; an explicit
    QT_QPA_PLATFORM=offscreen is the user's choice and opens the window unseen."""
    env = {**os.environ, "SPECVIEW_CONFIG_DIR": str(tmp_path / "config"), "SPECVIEW_EXIT_WHEN_SHOWN": "1"}
    for var in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM"):
        env.pop(var, None)
    res = subprocess.run([sys.executable, "-m", "specview", *argv], env=env, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 2, (res.returncode, res.stderr[-2000:])
    assert "specview: error: no display to open the window on" in res.stderr and "specview run" in res.stderr
    assert "window shown" not in res.stdout and "Traceback" not in res.stderr
    if argv:
        res = subprocess.run([sys.executable, "-m", "specview", *argv], env={**env, "QT_QPA_PLATFORM": "offscreen"},
                             capture_output=True, text=True, timeout=300)
        assert res.returncode == 0 and "specview: window shown" in res.stdout, res.stderr[-2000:]


def test_the_app_opens_a_real_x_window_and_leaves_the_server_up(tmp_path):
    """``specview gui`` on a real X server (Xvfb, which resets when its last client leaves and refuses connections
    while it does): the window is shown, twice in a row. specview's own check of the display holds its connection
    until Qt has one, so the check cannot be the last client to leave."""
    from require import missing

    xvfb = shutil.which("Xvfb")
    if xvfb is None:
        missing("no Xvfb to open a real window on: apt-get install xvfb", switch="SPECVIEW_REQUIRE_X11")
    if app.platform_problem() is not None:
        missing(f"Qt's X11 platform cannot load here: {app.platform_problem()}", switch="SPECVIEW_REQUIRE_X11")
    read, write = os.pipe()
    server = subprocess.Popen([xvfb, "-displayfd", str(write), "-screen", "0", "1280x800x24", "-nolisten", "tcp"],
                              pass_fds=(write,), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.close(write)
    try:
        with os.fdopen(read) as f:
            display = f.readline().strip()
        assert display.isdigit(), display
        env = {**os.environ, "DISPLAY": f":{display}", "SPECVIEW_EXIT_WHEN_SHOWN": "1",
               "SPECVIEW_CONFIG_DIR": str(tmp_path / "config")}
        for var in ("QT_QPA_PLATFORM", "WAYLAND_DISPLAY"):
            env.pop(var, None)
        for _ in range(2):
            res = subprocess.run([sys.executable, "-m", "specview", "gui", "--fresh", "--no-preload"], env=env,
                                 capture_output=True, text=True, timeout=300)
            assert res.returncode == 0 and "specview: window shown" in res.stdout, (res.returncode,
                                                                                     res.stderr[-2000:])
        assert server.poll() is None  # the server is still up
    finally:
        server.terminate()
        server.wait(timeout=30)

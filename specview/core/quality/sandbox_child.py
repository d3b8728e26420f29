"""The child side of the sandbox: run by ``python -I -S -c``, never imported.

:mod:`specview.core.quality.execute` runs this file's text after
:mod:`.sandbox_seccomp`'s and :mod:`.sandbox_guard`'s, compiled once and read
from an inherited descriptor, in a new session with a reduced environment,
stdin closed and stdout/stderr on one pipe, and reads the lines the
launcher and init write on the control descriptor (Python literals).
Three processes, each with a reason:

* the **launcher** moves into new namespaces where the platform allows (a
  network namespace with no interface up: no network; a PID namespace; a user
  namespace first when not root, since that is what lets an ordinary user make
  the others), then forks
* **init**, PID 1 of the new PID namespace: when it exits the kernel kills
  everything left in the namespace, so a grandchild that left the process group
  dies too.  It forks the sample, relays the sample's lines (bounded, each
  wrapped as the sample's) and reports its wait status and CPU time.
  (The sample itself is not PID 1, whose signals with a default action are
  ignored: SIGXCPU and SIGXFSZ would not stop it.)
* the **sample**, which closes the control descriptor first (it writes only
  on a pipe of its own that init reads) and puts itself behind the rest of the
  fences before it runs the program: a private tmpfs of ``disk_mb`` as its
  folder (and over /tmp, /var/tmp, /dev/shm), a fresh /proc and, when root,
  a tmpfs over any folder user nobody cannot enter that holds the interpreter
  (with the interpreter's trees bound back in), in a mount namespace; a user
  namespace of its own so RLIMIT_NPROC counts only its own processes (as
  root: user nobody); every capability dropped, from the bounding set too;
  Landlock (writes only under its folder, no TCP, no signals or /proc access
  to processes outside); the seccomp filter of :mod:`.sandbox_seccomp` (no
  socket, no leaving the process group, no ptrace); the resource limits; and
  last an in-process guard that turns the obvious destructive calls into a
  named failure (defence in depth: the kernel's fences are the ones that hold).

Its outcome line carries a nonce the parent gave init on a pipe of its own;
a line without it is not believed.

Stdlib only: the sample's interpreter has no site-packages.
"""

import ctypes
import os
import resource
import signal
import sys

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 1 << 14, 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_KEEPCAPS, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 4, 8, 24, 38
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH = 1, 2
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


def _read_interpreter_trees():
    return tuple(sorted({sys.prefix, sys.base_prefix, sys.exec_prefix,
                         os.path.dirname(os.path.realpath(sys.executable))}))


#: read when this file starts, before any mount: a venv's ``python`` is a symlink to its base interpreter,
#: and where the venv lies under a folder the sample's tmpfs covers (/tmp), ``realpath`` read after the
#: mounts no longer reaches the base and names the covered venv instead
_INTERPRETER_TREES = _read_interpreter_trees()


def interpreter_trees():
    """The interpreter's own trees (what a sample must read to import the standard library), as they were
    before the sample's mounts."""
    return list(_INTERPRETER_TREES)


def _blocker(tree):
    """The first folder on the way to ``tree`` that user nobody may not enter (no search bit for others), or None
    where none is (the tree's own files then only need their own bits)."""
    parts = tree.strip(os.sep).split(os.sep)
    for i in range(1, len(parts) + 1):
        path = os.sep + os.sep.join(parts[:i])
        try:
            if not os.stat(path).st_mode & 0o001:
                return path
        except OSError:
            return path
    return None


def expose_interpreter():
    """As root, before becoming nobody: a tmpfs over each folder nobody cannot enter on the way to the
    interpreter (``/root`` for a Python root installed there), with the interpreter's trees bound back in,
    so the sample needs no capability to read it and sees nothing else of that folder."""
    covered, exposed = set(), []
    for tree in interpreter_trees():
        top = _blocker(tree)
        if top is None or top == tree or any(tree.startswith(t + os.sep) for t in exposed):
            continue
        fd = os.open(tree, os.O_PATH | os.O_CLOEXEC)
        try:
            if top not in covered and _mount_tmpfs(top, 1, "0755") is not None:
                return False
            covered.add(top)
            if not _bind(fd, tree):
                _libc.umount2(top.encode(), MNT_DETACH)  # the folder as it was: the capability then stays
                return False
            exposed.append(tree)
        finally:
            os.close(fd)
    return True


def _bind(fd, tree):
    """The folder open as ``fd`` (O_PATH, taken before a mount hid it) bound at ``tree``, made where it is
    missing; whether the bind held."""
    os.makedirs(tree, mode=0o755, exist_ok=True)
    return _libc.mount(f"/proc/self/fd/{fd}".encode(), tree.encode(), None, ctypes.c_ulong(MS_BIND | MS_REC),
                       None) == 0


def _under(path, folder):
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def keep_interpreter(scratch):
    """Descriptors of the interpreter's trees that lie in a scratch folder the sample's tmpfs is about to cover
    (the desktop app unpacked under /tmp), taken before it does: :func:`bind_back` puts them back."""
    kept = {}
    for tree in interpreter_trees():
        if any(_under(tree, s) for s in scratch) and not any(_under(tree, t) for t in kept):
            try:
                kept[tree] = os.open(tree, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                pass
    return kept


def bind_back(kept):
    """Each kept tree bound back, read-only, where it was, under the fresh tmpfs: the interpreter reads its own
    files (the app's archive, its libraries) and the sample sees nothing else of that folder.  The trees bound."""
    done = []
    old = os.umask(0o022)  # the folders made on the way are enterable by the sample's user
    try:
        for tree, fd in sorted(kept.items()):
            try:
                if _bind(fd, tree):
                    _libc.mount(b"none", tree.encode(), None,
                                ctypes.c_ulong(MS_REMOUNT | MS_BIND | MS_RDONLY | MS_REC), None)
                    done.append(tree)
            except OSError:
                pass
            finally:
                os.close(fd)
    finally:
        os.umask(old)
    return done


def private_mounts(folder, disk_mb, program, expose):
    """A mount namespace: tmpfs over the scratch folders and as the sample's folder, a fresh /proc, the
    interpreter's trees that were in a scratch folder bound back (:func:`bind_back`), and (as root,
    ``expose``) :func:`expose_interpreter`.

    The sample's files then live in memory capped at ``disk_mb`` and vanish
    with the namespace; the program is written into the new folder.
    """
    why = _unshare(CLONE_NEWNS)
    if why is not None:
        return {"folder_quota": False, "proc": False, "why": why}
    _libc.mount(b"none", b"/", None, ctypes.c_ulong(MS_REC | MS_PRIVATE), None)
    exposed = expose_interpreter() if expose else None
    scratch = [s for s in ("/tmp", "/var/tmp", "/dev/shm") if os.path.isdir(s) and not os.path.islink(s)]
    kept = keep_interpreter(scratch)
    for s in scratch:
        _mount_tmpfs(s, disk_mb, "1777")
    rebound = bind_back(kept)
    os.makedirs(folder, mode=0o700, exist_ok=True)  # where the folder was under a folder now covered
    why = _mount_tmpfs(folder, disk_mb)
    os.chdir(folder)  # the cwd still pointed at the directory under the mount
    proc = _libc.mount(b"proc", b"/proc", b"proc", ctypes.c_ulong(MS_NOSUID | MS_NODEV), None) == 0
    with open(os.path.join(folder, "sample.py"), "w", encoding="utf-8") as f:
        f.write(program)
    return {"folder_quota": why is None, "proc": proc, "why": why or "", "exposed": exposed, "rebound": rebound}


def _reachable(tree):
    """Whether user nobody may enter ``tree`` by its mode bits alone (no capability)."""
    return _blocker(tree) is None or (_blocker(tree) == tree and os.stat(tree).st_mode & 0o005 == 0o005)


def _caps():
    """This process's (effective, permitted, bounding) capability sets, from /proc/self/status (None where
    there is no /proc to read them from)."""
    try:
        with open("/proc/self/status") as f:
            got = dict(line.split(":\t", 1) for line in f.read().splitlines() if line.startswith("Cap"))
        return tuple(int(got[k], 16) for k in ("CapEff", "CapPrm", "CapBnd"))
    except (OSError, KeyError, ValueError):
        return None


def drop_bounding_set():
    """Empty the bounding set (no exec can give a capability back) and the ambient set; needs CAP_SETPCAP."""
    for cap in range(64):
        if _libc.prctl(PR_CAPBSET_DROP, ctypes.c_ulong(cap), ctypes.c_ulong(0), ctypes.c_ulong(0),
                       ctypes.c_ulong(0)) != 0 and ctypes.get_errno() == 22:
            break  # EINVAL: past the last capability this kernel has
    _libc.prctl(PR_CAP_AMBIENT, ctypes.c_ulong(PR_CAP_AMBIENT_CLEAR_ALL), ctypes.c_ulong(0), ctypes.c_ulong(0),
                ctypes.c_ulong(0))


def drop_capabilities(keep=0):
    """Effective and permitted sets to ``keep`` (a mask of the first 32), inheritable empty (capset v3); where
    ``keep`` is not all permitted, none.  The facts: what is left, read back from the kernel."""
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)
    if _libc.capset(header, (ctypes.c_uint32 * 6)(keep, keep, 0, 0, 0, 0)) != 0:
        _libc.capset(header, (ctypes.c_uint32 * 6)(0, 0, 0, 0, 0, 0))
    caps = _caps()
    return {"capabilities": list(caps) if caps else None, "capabilities_dropped": bool(caps) and not any(caps[:2]),
            "read_capability": bool(caps) and bool(caps[0] & (1 << CAP_DAC_READ_SEARCH | 1 << CAP_DAC_OVERRIDE))}


def become_nobody(folder):
    """Root is exempt from RLIMIT_NPROC by its uid, whatever its capabilities: the sample becomes ``nobody``
    with no capability at all, unless the interpreter's trees are out of nobody's reach (no mount namespace
    to expose them in): then CAP_DAC_READ_SEARCH stays, and the report says that it reads every file.

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
    keep = 0 if all(_reachable(t) for t in interpreter_trees()) else 1 << CAP_DAC_READ_SEARCH
    drop_bounding_set()
    _prctl(PR_SET_KEEPCAPS, 1)
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    return {"uid": uid, **drop_capabilities(keep)}


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def readable_paths():
    """What a sample may read besides its folder: the interpreter's own trees, the system's libraries, its
    own /proc (a fresh one: the namespace's processes only) and a few devices; not /etc, /home or /root."""
    trees = {*interpreter_trees(), "/usr", "/lib", "/lib64", "/bin", "/proc"}
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


def _refused(call):
    """Whether ``call()`` was refused (an OSError; anything else it returns is closed if it can be)."""
    try:
        got = call()
    except OSError:
        return True
    getattr(got, "close", lambda: None)()
    return False


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
    # a Unix socket made is one that reaches any listener by its path (no namespace hides /run or /var/run)
    facts["unix"] = _refused(lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
    try:
        block = bytearray((lim["memory_mb"] + 64) * 1024 * 1024)
        del block
        facts["memory"] = False
    except MemoryError:
        facts["memory"] = True
    facts["group"] = _refused(lambda: os.setpgid(0, 0))  # last: the probe leaves its group if it may
    send(probe=facts)


def fence_sample(cfg, folder):
    """Everything between init's fork and the program: see the module's docstring for the order and why."""
    facts = {}
    program = open(os.path.join(folder, "sample.py"), encoding="utf-8").read()
    off = cfg.get("off", ())
    if LINUX:
        uid, gid = os.getuid(), os.getgid()
        if "mounts" not in off:
            facts.update(private_mounts(folder, cfg["limits"]["disk_mb"], program, expose=uid == 0))
        if uid == 0:
            facts.update(become_nobody(folder))
        else:
            # a user namespace of its own: RLIMIT_NPROC then counts only the sample's processes
            facts["own_user_namespace"] = _unshare(CLONE_NEWUSER) is None
            if facts["own_user_namespace"]:
                _map_self(uid, gid)
            drop_bounding_set()
            facts.update(drop_capabilities())
        _prctl(PR_SET_DUMPABLE, 0)  # no core dump of a crash, and /proc/self is not readable by others
        facts["landlock"], facts["landlock_why"] = landlock(folder) if "landlock" not in off else (0, "off")
        seccomp = install_seccomp(_libc) if "seccomp" not in off else (False, "off")  # noqa: F821 - sandbox_seccomp's
        facts["seccomp"], facts["seccomp_why"] = seccomp
    else:  # no capabilities to drop: root's file access is its uid's
        facts["capabilities_dropped"], facts["read_capability"] = os.geteuid() != 0, os.geteuid() == 0
    facts["limits"] = set_limits(cfg["limits"])
    send(fences=facts)
    if cfg.get("probe"):
        probe(cfg["limits"])


def run_program(cfg, folder, nonce):
    """Run the program; its outcome line carries ``nonce`` (the one line the parent believes a pass from)."""
    import builtins
    sys.dont_write_bytecode = True
    sys.argv = ["sample.py"]
    path = os.path.join(folder, "sample.py")
    if cfg["guard"]:
        install_guard(os.path.realpath(folder), cfg["limits"]["processes"])  # noqa: F821 - sandbox_guard's
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
    send(**outcome, nonce=nonce)
    os._exit(0)


#: what init relays of the sample's lines: this many, each up to this many bytes (the rest is dropped)
RELAY_LINES, RELAY_LINE_BYTES = 16, 65536


class _Relay:
    """The sample's lines, framed and bounded, forwarded on the control descriptor as ``{'sample': line}``."""

    def __init__(self):
        self.buf, self.lines, self.skipping = bytearray(), 0, False

    def add(self, data):
        self.buf += data
        *complete, rest = self.buf.split(b"\n")
        for line in complete:
            if self.skipping:  # the end of a line too long to keep
                self.skipping = False
            elif self.lines < RELAY_LINES:
                self.lines += 1
                send(sample=line.decode("utf-8", "replace"))
        self.buf = bytearray(rest)
        if len(self.buf) > RELAY_LINE_BYTES:
            self.buf, self.skipping = bytearray(), True


def _relay_until_exit(pid, rfd, wake):
    """Forward the sample's lines until it has exited and its pipe is drained (or closed); its wait4 result."""
    import select
    relay, ended = _Relay(), None
    while True:
        if ended is None:
            got, status, usage = os.wait4(pid, os.WNOHANG)
            if got:
                ended = (status, usage)
        ready = select.select([rfd, wake] if rfd >= 0 else [wake], [], [], 0 if ended else None)[0]
        if wake in ready:
            os.read(wake, 4096)
        data = os.read(rfd, 65536) if rfd in ready else None
        if data:
            relay.add(data)
        elif data is not None:  # closed by every writer
            os.close(rfd)
            rfd = -1
        if ended is not None and not data:
            return ended


def init(cfg, folder, nonce):
    """PID 1 of the namespace: fork the sample, relay its lines, report its status, exit (the kernel then kills
    what is left).  The sample keeps no descriptor of the control channel: it writes on a pipe of its own."""
    global _CTL
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in (cfg["ctl"], rfd, wake_r, wake_w):
            os.close(fd)
        _CTL = wfd
        _prctl(PR_SET_DUMPABLE, 1)  # init's is off; the sample maps its own user namespace through /proc/self
        try:
            fence_sample(cfg, folder)
            run_program(cfg, folder, nonce)
        except BaseException as e:  # noqa: BLE001 - the sandbox's own failure, reported
            send(sandbox_error=f"{type(e).__name__}: {e}")
        os._exit(70)
    os.close(wfd)
    status, usage = _relay_until_exit(pid, rfd, wake_r)
    send(status=status, cpu_s=usage.ru_utime + usage.ru_stime, maxrss_kb=usage.ru_maxrss)
    os._exit(0)


def main():
    global _CTL
    cfg = eval(sys.argv[-1], {"__builtins__": {}})  # noqa: S307 - the parent's own literal of str, int, bool
    _CTL = cfg["ctl"]
    nonce = os.read(cfg["nonce"], 256).decode()
    os.close(cfg["nonce"])
    folder = cfg["folder"]
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    off = cfg.get("off", ())
    send(namespaces=enter_namespaces() if "namespaces" not in off else {"network": False, "pid": False, "why": "off"})
    _prctl(PR_SET_DUMPABLE, 0)  # after its own uid map: no process of the sample's uid opens its /proc files
    pid = os.fork()
    if pid == 0:
        init(cfg, folder, nonce)
    os.waitpid(pid, 0)


if __name__ == "__main__":
    main()

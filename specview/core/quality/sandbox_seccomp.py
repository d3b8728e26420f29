"""The sandbox's seccomp filter: the system calls a sample is refused whatever its namespaces and Landlock.

Not imported: :mod:`specview.core.quality.execute` runs this file's text
ahead of :mod:`.sandbox_child`'s in the child's one ``-c`` program, so it
defines names only (stdlib and ctypes, no imports of its own package).

The filter (classic BPF, x86-64 and arm64; any other architecture gets no
filter and the report says so) refuses, with ``EPERM`` unless noted:

* ``socket()`` of every family: no TCP, UDP, Unix socket (by path or abstract
  name), netlink or raw socket can be made, so nothing outside is reachable
  through one, namespaces or not.  ``socketpair()`` stays: an unnamed pair
  within the sample reaches nothing;
* ``io_uring_*`` (``ENOSYS``), whose own socket and connect operations no
  filter sees;
* ``setsid()`` and ``setpgid()``: the sample and everything it starts stay in
  the process group specview kills, PID namespace or not;
* ``ptrace()`` and ``process_vm_readv/writev()``: no other process's memory
  (the sandbox's own launcher included);
* ``unshare()``, ``setns()``, ``clone()`` with a ``CLONE_NEW*`` flag and
  ``clone3()`` (``ENOSYS``, so the C library falls back to ``clone``): no
  namespaces of its own, whose capabilities would reopen mounts;
* ``bpf()``, ``perf_event_open()``, ``userfaultfd()`` and the key ring calls:
  kernel surface no test needs;
* every system call of another architecture's table (x32, i386 on x86-64).

A filter cannot be removed once installed, and every process the sample
starts inherits it.
"""

import ctypes
import errno
import os

PR_SET_NO_NEW_PRIVS_, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
_RET_ALLOW, _RET_ERRNO = 0x7FFF0000, 0x00050000
_LD_W_ABS, _JEQ_K, _JGE_K, _JSET_K, _RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
#: every CLONE_NEW* flag but CLONE_NEWTIME (whose bit clone() shares with the exit signal)
_CLONE_NEW = 0x7E020000
#: (audit architecture, {name: number}) of the tables the filter knows
_TABLES = {
    "x86_64": (0xC000003E, {"socket": 41, "clone": 56, "ptrace": 101, "setpgid": 109, "setsid": 112, "add_key": 248,
                            "request_key": 249, "keyctl": 250, "unshare": 272, "perf_event_open": 298, "setns": 308,
                            "process_vm_readv": 310, "process_vm_writev": 311, "bpf": 321, "userfaultfd": 323,
                            "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "clone3": 435}),
    "aarch64": (0xC00000B7, {"unshare": 97, "ptrace": 117, "setpgid": 154, "setsid": 157, "socket": 198,
                             "add_key": 217, "request_key": 218, "keyctl": 219, "clone": 220, "perf_event_open": 241,
                             "setns": 268, "process_vm_readv": 270, "process_vm_writev": 271, "bpf": 280,
                             "userfaultfd": 282, "io_uring_setup": 425, "io_uring_enter": 426,
                             "io_uring_register": 427, "clone3": 435}),
}
_NOT_THERE = {"io_uring_setup", "io_uring_enter", "io_uring_register", "clone3"}


class _Insn(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Insn))]


def seccomp_program(machine):
    """The filter's instructions for ``machine`` (``os.uname().machine``), or None where no table is known."""
    key = {"amd64": "x86_64", "arm64": "aarch64"}.get(machine.lower(), machine.lower())
    if key not in _TABLES:
        return None
    arch, nrs = _TABLES[key]
    deny = _RET_ERRNO | errno.EPERM
    prog = [(_LD_W_ABS, 0, 0, 4), (_JEQ_K, 1, 0, arch), (_RET_K, 0, 0, deny), (_LD_W_ABS, 0, 0, 0)]
    if key == "x86_64":
        prog += [(_JGE_K, 0, 1, 0x40000000), (_RET_K, 0, 0, deny)]  # the x32 table
    for name, nr in sorted(nrs.items(), key=lambda kv: kv[1]):
        if name == "clone":
            continue
        code = errno.ENOSYS if name in _NOT_THERE else errno.EPERM
        prog += [(_JEQ_K, 0, 1, nr), (_RET_K, 0, 0, _RET_ERRNO | code)]
    prog += [(_JEQ_K, 0, 3, nrs["clone"]), (_LD_W_ABS, 0, 0, 16), (_JSET_K, 0, 1, _CLONE_NEW), (_RET_K, 0, 0, deny),
             (_RET_K, 0, 0, _RET_ALLOW)]
    return prog


def install_seccomp(libc):
    """Install the filter on this process (and so on all it starts): ``(True, "")``, or ``(False, why)``."""
    if libc is None:
        return False, "not Linux"
    prog = seccomp_program(os.uname().machine)
    if prog is None:
        return False, f"no seccomp table for this architecture ({os.uname().machine})"
    insns = (_Insn * len(prog))(*[_Insn(*i) for i in prog])
    fprog = _Prog(len(prog), insns)
    libc.prctl(PR_SET_NO_NEW_PRIVS_, ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))
    if libc.prctl(PR_SET_SECCOMP, ctypes.c_ulong(SECCOMP_MODE_FILTER), ctypes.byref(fprog), ctypes.c_ulong(0),
                  ctypes.c_ulong(0)) != 0:
        return False, os.strerror(ctypes.get_errno())
    return True, ""

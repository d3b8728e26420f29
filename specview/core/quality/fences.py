"""What held around a sample, in words: the fences the child reported and the probe found, the gaps, and the
fences ``specview quality --execute`` promises (:data:`PROMISED`).

:mod:`.execute` builds a :class:`Fences` from the control channel's lines;
the CLI, the app's confirmation and the docs read its :meth:`Fences.lines`,
:meth:`Fences.gaps` and :meth:`Fences.missing`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: the environment a sample gets: nothing else of the parent's (then HOME and TMPDIR, its folder)
SAMPLE_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "PYTHONIOENCODING": "utf-8"}

#: the fences docs/quality-sandbox.md promises: ``specview quality --execute`` refuses to run where one is missing
#: unless it is given ``--allow-weak-sandbox``; (key, the fence in words)
PROMISED = (
    ("network", "no network: no TCP or UDP socket reaches anything"),
    ("unix", "no Unix socket: none can be made, so no listener is reachable by its path or an abstract name"),
    ("writes", "writes only in its own folder, and no access to other processes' files in /proc (Landlock)"),
    ("capabilities", "no capabilities: it reads only what its own user may"),
    ("processes", "no new processes or threads beyond its budget (RLIMIT_NPROC)"),
    ("memory", "memory capped (RLIMIT_AS)"),
    ("kill", "everything it starts dies with it (a PID namespace, or a process group it cannot leave)"),
)


@dataclass(frozen=True)
class Fences:
    """What held around one sample, as the child reported it before its program ran (None where it did not
    report: it died first), and what the report's probe found."""

    network: bool = False
    pid_namespace: bool = False
    folder_quota: bool = False
    private_proc: bool = False
    own_user_namespace: bool = False
    capabilities_dropped: bool = False
    #: the sample kept CAP_DAC_READ_SEARCH or CAP_DAC_OVERRIDE (or is root where there are no capabilities)
    read_capability: bool = False
    landlock_abi: int = 0
    seccomp: bool = False
    uid: int | None = None
    limits: dict[str, bool] = field(default_factory=dict)
    why: str = ""
    #: what the report's probe tried, and whether the fence stopped it
    #: (``processes``, ``network``, ``unix``, ``memory``, ``group``)
    probed: dict[str, bool] = field(default_factory=dict)

    @property
    def network_denied(self) -> bool:
        return self.probed.get("network", self.network or self.seccomp or self.landlock_abi >= 4)

    @property
    def unix_denied(self) -> bool:
        return self.probed.get("unix", self.seccomp)

    @property
    def processes_limited(self) -> bool:
        return self.probed.get("processes", bool(self.limits.get("RLIMIT_NPROC")))

    @property
    def memory_limited(self) -> bool:
        return self.probed.get("memory", bool(self.limits.get("RLIMIT_AS")))

    @property
    def kill_complete(self) -> bool:
        """Whether nothing the sample starts outlives the kill: a PID namespace, or it cannot leave the group."""
        return self.pid_namespace or self.probed.get("group", self.seccomp)

    def holds(self, key: str) -> bool:
        """Whether the promised fence ``key`` (of :data:`PROMISED`) held."""
        return {"network": self.network_denied, "unix": self.unix_denied, "writes": self.landlock_abi > 0,
                "capabilities": self.capabilities_dropped and not self.read_capability,
                "processes": self.processes_limited, "memory": self.memory_limited,
                "kill": self.kill_complete}[key]

    def missing(self) -> list[str]:
        """The promised fences (:data:`PROMISED`, in words) that did not hold here."""
        return [words for key, words in PROMISED if not self.holds(key)]

    def gaps(self) -> list[str]:
        """What this platform did not enforce, in words (empty where everything held)."""
        who = "user nobody" if self.uid is not None else "your own user"
        gaps = []
        if not self.network_denied:
            gaps.append("network not denied on this platform")
        if not self.unix_denied:
            gaps.append("Unix sockets not denied on this platform: a sample reaches any listener its user may "
                        "connect to (a session bus, docker.sock)")
        if not self.processes_limited:
            gaps.append("processes not limited on this platform (only the in-process guard and the clock)")
        if not self.memory_limited:
            gaps.append("memory not limited on this platform")
        if not self.landlock_abi:
            gaps.append("writes outside the folder not prevented on this platform (only the in-process guard and "
                        f"the file permissions of {who}); reads not confined to the interpreter and the system's "
                        "libraries")
        if self.read_capability:
            gaps.append("reads not confined: the sample keeps a capability that reads every file on this machine")
        elif not self.capabilities_dropped:
            gaps.append("capabilities not dropped on this platform")
        if not self.pid_namespace and self.landlock_abi < 6:
            gaps.append(f"signals not fenced: with no PID namespace and no Landlock scoping (ABI 6) a sample may "
                        f"signal any process of {who}")
        if not self.kill_complete:
            gaps.append("no PID namespace and no seccomp: a sample that leaves its process group outlives the kill")
        if not self.folder_quota:
            gaps.append("no mount namespace: the folder is on disk with no total cap, and /tmp is the machine's")
        return gaps

    def lines(self, limits: Any) -> list[str]:
        """What holds around each sample under ``limits`` (an ``execute.Limits``), one fact a line, for
        ``specview quality`` and the docs."""
        net = [w for w, on in (("a network namespace of its own, no interface up", self.network),
                               ("seccomp refuses every socket()", self.seccomp),
                               ("Landlock refuses TCP", self.landlock_abi >= 4)) if on]
        procs = ("new processes and threads refused (RLIMIT_NPROC)" if limits.processes == 0 else
                 f"at most {limits.processes} besides itself (RLIMIT_NPROC)")
        files = (f"writes only in its folder; reads only its folder, the interpreter and the system's libraries; "
                 f"no other process's /proc files (Landlock ABI {self.landlock_abi})" if self.landlock_abi else
                 "writes outside its folder NOT prevented on this platform (the in-process guard only)")
        folder = (f"a private {limits.disk_mb} MB tmpfs, gone with the sample" if self.folder_quota else
                  "a temporary folder on disk, removed afterwards (no total cap on this platform)")
        kill = (" with its PID namespace" if self.pid_namespace else
                ", which it cannot leave (seccomp)" if self.kill_complete else
                "; a process that left the group is NOT killed")
        user = ("nobody" if self.uid is not None else "the same user") + (
            ", keeping CAP_DAC_READ_SEARCH (it reads every file)" if self.read_capability else
            ", no capabilities" if self.capabilities_dropped else ", capabilities NOT dropped")
        return [
            "network: " + ("denied (" + "; ".join(net) + ")" if self.network_denied else
                           "NOT denied on this platform"),
            "unix sockets: " + ("none can be made (seccomp)" if self.unix_denied else
                                "NOT denied on this platform"),
            f"processes: {procs if self.processes_limited else 'NOT limited on this platform'}",
            f"memory: {limits.memory_mb} MB of address space (RLIMIT_AS)" if self.memory_limited
            else "memory: NOT limited on this platform",
            f"time: {limits.wall_s:g} s wall clock (then its process group is killed{kill}), "
            f"{limits.cpu_s:g} s CPU (RLIMIT_CPU)",
            f"files: {files}; each file up to {limits.file_mb} MB (RLIMIT_FSIZE)",
            f"folder: {folder}; it is the sample's cwd, HOME and TMPDIR",
            "environment: only " + ", ".join([*SAMPLE_ENV, "HOME", "TMPDIR"]) + "; stdin closed",
            "other processes: " + ("hidden (a PID namespace with its own /proc)" if self.private_proc else
                                   "in a PID namespace" if self.pid_namespace else "visible"),
            "user: " + user,
            "control channel: the sample holds no descriptor of it; specview kills only the process group it "
            "started, never a pid a sample names",
            "score: a pass counts only from the outcome line carrying this sample's nonce, with exit status 0 "
            "from init; a program written against specview's harness can still read the nonce in its own "
            "interpreter and fake its pass",
        ]

    @classmethod
    def from_records(cls, facts: list[dict[str, Any]], claims: list[dict[str, Any]]) -> "Fences":
        """From init's and the launcher's ``facts`` and the first fences and probe lines of the sample's
        ``claims`` (written before its program ran: later ones are the program's and not read)."""
        ns = next((r["namespaces"] for r in facts if isinstance(r.get("namespaces"), dict)), {})
        f = next((r["fences"] for r in claims if "fences" in r), {})
        f = f if isinstance(f, dict) else {}
        probed = next((r["probe"] for r in claims if "probe" in r), {})
        return cls(network=bool(ns.get("network")), pid_namespace=bool(ns.get("pid")),
                   folder_quota=bool(f.get("folder_quota")), private_proc=bool(f.get("proc")),
                   own_user_namespace=bool(f.get("own_user_namespace")),
                   capabilities_dropped=bool(f.get("capabilities_dropped")),
                   read_capability=bool(f.get("read_capability")), seccomp=bool(f.get("seccomp")),
                   landlock_abi=int(f.get("landlock", 0) or 0), limits=dict(f.get("limits", {})),
                   uid=f.get("uid") if isinstance(f.get("uid"), int) else None,
                   probed={k: bool(v) for k, v in probed.items()} if isinstance(probed, dict) else {},
                   why="; ".join(str(w) for w in (ns.get("why"), f.get("why"), f.get("landlock_why"),
                                                  f.get("seccomp_why")) if w))


__all__ = ["PROMISED", "SAMPLE_ENV", "Fences"]

"""The sandbox a student's kernel runs in while it is graded, built with bubblewrap (bwrap).

A submission is hostile code, and the kernel is the only process that runs it.  The
grading worker (nbgrader, the comparison with hidden golden outputs, the grades) stays
outside; it starts the kernel through ``python -m autograder.sandbox.bubblewrap``, which:
  1. moves itself into the submission's cgroup, where the grader made one (``autograder.sandbox.cgroups``:
     a cap on the memory of the whole sandbox);
  2. sets resource limits that the sandbox cannot raise: address space (where no cgroup caps
     memory), CPU seconds, processes, file size, open files, and no core dumps;
  3. executes ``bwrap`` in one of two modes (``autograder.sandbox.isolation`` picks it):
     * as root (``ROOT``): bwrap mounts what the student's uid cannot reach (the interpreter lives
       under /root here), then ``setpriv`` drops to the student's own unprivileged uid;
     * as a normal user (``USERNS``): bwrap makes an unprivileged user namespace, as Flatpak does,
       and the kernel runs as the instructor's own uid mapped into it, with no capabilities;
     either way with its own PID, network (loopback only), IPC, UTS and cgroup namespaces; a
     read-only view of /usr, /etc, the interpreter, the venv, the engine, the visible data and, for lab 10,
     the student's saved parts handed in (``mine/``, at MINE);
     one size-capped tmpfs for /tmp, HOME and the working folder; and the runtime folder.
     labs/, course/, the instructors' packages of autograder/ (hidden data, design references, grading
     code), other submissions and the gradebook are not there.

The kernel talks to the worker over Unix sockets in a folder both can see (ZeroMQ's
``ipc`` transport), since the sandbox has no network.  Everything the sandbox started is
in its PID namespace, so it all dies with the kernel; the worker cannot be signalled
from inside, because no process outside the namespace is visible.
"""
from __future__ import annotations

import dataclasses
import json
import os
import resource
import shutil
import sys
from pathlib import Path

from jupyter_client.manager import AsyncKernelManager

from autograder import course_paths

REPO = Path(__file__).resolve().parents[2]
# One tmpfs holds everything the kernel may write besides the runtime folder, so that one size caps it all.
SCRATCH = "/tmp"
HOME, WORK = f"{SCRATCH}/home", f"{SCRATCH}/work"
MINE = f"{SCRATCH}/mine"  # the student's saved parts, when handed in: $MINIENGINE_MINE inside (lab 10 serves them)
ROOT, USERNS = "bubblewrap-root", "bubblewrap-userns"  # the two modes, as grades.json records them
ENGINE_PARTS = ("miniengine", "autograder", "data")  # what the kernel may import or read from the repository


@dataclasses.dataclass
class Sandbox:
    runtime: str   # connection file and kernel sockets, shared with the worker ("": none, for a probe)
    cases: str     # where the hidden files' inputs appear while a hidden test cell runs (read-only inside)
    uid: int | None  # the student's own uid (mode ROOT); None: the instructor's, in a user namespace (USERNS)
    status: str = ""  # where bwrap writes its child's pid and namespaces (never inside the sandbox)
    cgroup: str = ""  # the submission's cgroup (autograder.sandbox.cgroups), which the launcher joins; "": none
    inputs: str = ""  # the grader's copy of those inputs (autograder.hidden_outputs.public_view), never mounted
    hidden_cells: list = dataclasses.field(default_factory=list)  # grade ids of the lab's hidden test cells
    memory_gb: float = 6.0  # address space per process (RLIMIT_AS); 0 where a cgroup caps memory instead
    cpu_seconds: int = 600
    max_processes: int = 256  # threads count too: torch, ZeroMQ and IPython start a few dozen
    max_file_mb: int = 256
    disk_mb: int = 1024  # the scratch tmpfs: /tmp, HOME and the working folder together
    mine: str = ""  # the grader's copy of the mine/ handed in (submissions.snapshot_mine), mounted read-only at MINE

    def prepare(self) -> None:
        """Make the runtime folder, owned by the student's uid where the worker runs as root."""
        os.makedirs(self.cases, exist_ok=True)
        self.show_hidden_inputs(False)
        os.makedirs(self.runtime, exist_ok=True)
        if self.uid is not None and os.geteuid() == 0:
            os.chown(self.runtime, self.uid, self.uid)
        os.chmod(self.runtime, 0o700)

    def close_runtime(self) -> None:
        """Once the kernel has made its sockets (it answers before the first cell runs), take the runtime folder
        back from the student's uid (ROOT): the kernel can then create no file there, so the folder's files stay
        its sockets and cannot fill the host's disk. In USERNS the kernel has the grader's own uid, so the folder
        stays writable (autograder/README.md, trust model)."""
        if self.uid is not None and os.geteuid() == 0 and self.runtime:
            os.chown(self.runtime, 0, 0)
            os.chmod(self.runtime, 0o755)

    def show_hidden_inputs(self, shown: bool) -> None:
        """Put the hidden prompts where the kernel can read them, or take them away again (see GuardedExecute)."""
        if not self.inputs:
            return
        for src in Path(self.inputs).glob("*.json"):
            dest = Path(self.cases) / src.name
            if shown:
                shutil.copyfile(src, dest)
                dest.chmod(0o644)
            else:
                dest.unlink(missing_ok=True)

    def wrap(self, argv: list[str]) -> list[str]:
        """The command that runs ``argv`` inside this sandbox."""
        return [sys.executable, "-m", "autograder.sandbox.bubblewrap", json.dumps(dataclasses.asdict(self)), str(os.getpid()),
                "--", *argv]


# ------------------------------------------------------------------ inside the launcher

def _read_only_sources(sandbox: Sandbox) -> list[str]:
    """Folders the kernel reads: the system, the interpreter, the venv, the engine, the visible data, the inputs."""
    prefixes = {os.path.realpath(p) for p in (sys.base_prefix, sys.prefix)}
    folders = ["/usr", "/etc", *sorted(p for p in prefixes if not p.startswith("/usr/"))]
    folders += [str(REPO / part) for part in ENGINE_PARTS]
    if sandbox.cases:
        folders.append(sandbox.cases)
    return [f for f in folders if os.path.isdir(f)]


def bwrap_arguments(sandbox: Sandbox, argv: list[str]) -> list[str]:
    read_only = _read_only_sources(sandbox)
    writable = [sandbox.runtime] if sandbox.runtime else []
    args = ["bwrap", "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-net", "--unshare-ipc",
            "--unshare-uts", "--unshare-cgroup-try", "--hostname", "grading-sandbox"]
    if sandbox.uid is None:
        # USERNS: no root, so bwrap makes a user namespace; inside it nobody may make another (a nested one
        # would hand the kernel fresh capabilities to mount with).
        args += ["--unshare-user", "--disable-userns"]
    # else ROOT: bwrap runs as root so that it can mount what the student's uid cannot reach, without a user
    # namespace, so that the uid the kernel gets is a real one: RLIMIT_NPROC does not apply to root.
    args += ["--proc", "/proc", "--dev", "/dev",
             "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib", "--symlink", "usr/sbin", "/sbin"]
    if os.path.isdir("/usr/lib64"):
        args += ["--symlink", "usr/lib64", "/lib64"]
    # One tmpfs for everything the kernel writes (its files live in memory and vanish with the sandbox): a full
    # one fails the writing cell with "No space left on device", and nothing reaches the grading host's disk.
    args += ["--size", str(sandbox.disk_mb << 20), "--perms", "1777", "--tmpfs", SCRATCH]
    for folder in (HOME, WORK):
        args += ["--perms", "1777", "--dir", folder]
    # A private /dev/shm: multiprocessing's locks and queues are POSIX semaphores there (lab 09 starts its
    # tensor-parallel ranks with torch.multiprocessing).  bwrap's --dev leaves it unwritable.
    args += ["--size", str(64 << 20), "--perms", "1777", "--tmpfs", "/dev/shm"]
    # bwrap would make the folders above each mount point 0700 root; the student's uid must traverse them.
    parents = sorted({str(p) for path in read_only + writable for p in Path(path).parents
                      if str(p) not in ("/", SCRATCH)}, key=lambda p: p.count("/"))
    for parent in parents:
        args += ["--perms", "0755", "--dir", parent]
    for path in read_only:
        args += ["--ro-bind", path, path]
    if sandbox.mine:
        args += ["--ro-bind", sandbox.mine, MINE]
    # Inside the engine's folder the kernel sees what a student's edition holds: none of the instructors' packages
    # (no hidden data, no design part's reference in autograder/qa/design/, an answer key for the labs' design tasks,
    # no grading code), and no other kernel's state from the venv's home.
    masks = [REPO / "autograder" / name for name in course_paths.INSTRUCTOR_PACKAGES] + [Path(sys.prefix) / "home"]
    for mask in masks:
        if mask.is_dir():
            args += ["--tmpfs", str(mask), "--remount-ro", str(mask)]
    for path in writable:
        args += ["--bind", path, path]
    # The sandbox's own root is a tmpfs too, writable by the kernel in a user namespace, and counted in no cap.
    # So are /dev's (the devices are mounts of their own, so /dev/null and /dev/shm stay writable).
    args += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", WORK]
    env = {
        "HOME": HOME, "PATH": f"{os.path.dirname(sys.executable)}:/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
        "TMPDIR": SCRATCH, "IPYTHONDIR": f"{HOME}/.ipython", "MPLCONFIGDIR": f"{HOME}/.matplotlib",
        "JUPYTER_CONFIG_DIR": f"{HOME}/.jupyter", "JUPYTER_DATA_DIR": f"{HOME}/.jupyter-data",
        "JUPYTER_RUNTIME_DIR": f"{HOME}/.jupyter-runtime", "JUPYTER_PLATFORM_DIRS": "1",
        "PYDEVD_DISABLE_FILE_VALIDATION": "1", "PYTHONDONTWRITEBYTECODE": "1",
        "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
        "AUTOGRADER_HIDDEN_CASES": sandbox.cases,
        **({"MINIENGINE_MINE": MINE} if sandbox.mine else {}),
    }
    if sandbox.memory_gb:  # read by autograder.kernel_limits in the kernel; none where a cgroup caps memory
        env["AUTOGRADER_KERNEL_MEMORY_GB"] = str(sandbox.memory_gb)
    # OPENBLAS_*: this machine's OpenBLAS needs them.  NBGRADER_EXECUTION: nbgrader's autograde sets it, and the
    # labs' measurement cells run short under it, as grading promises.
    for name in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "NBGRADER_EXECUTION"):
        if name in os.environ:
            env[name] = os.environ[name]
    args.append("--clearenv")
    for name, value in env.items():
        args += ["--setenv", name, value]
    if sandbox.uid is not None:
        first = ["setpriv", f"--reuid={sandbox.uid}", f"--regid={sandbox.uid}", "--clear-groups", "--inh-caps=-all",
                 "--bounding-set=-all", "--no-new-privs", "--"]
    else:
        # RLIMIT_NPROC counts a uid's processes per user namespace (Linux 5.14+): set inside the sandbox's own
        # namespace, it caps this sandbox alone, though every kernel runs as the instructor's uid.
        first = ["prlimit", f"--nproc={sandbox.max_processes}:{sandbox.max_processes}", "--"]
    return args + ["--", *first, *argv]


def _set_limits(sandbox: Sandbox) -> None:
    def cap(which, value):
        value = int(value)
        _, hard = resource.getrlimit(which)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        resource.setrlimit(which, (value, value))

    if sandbox.memory_gb:  # 0: no address-space limit (grade --memory-gb 0)
        cap(resource.RLIMIT_AS, sandbox.memory_gb * 1e9)
    cap(resource.RLIMIT_CPU, sandbox.cpu_seconds)
    if sandbox.uid is not None:  # USERNS sets it inside the sandbox (bwrap_arguments): here it would count all
        cap(resource.RLIMIT_NPROC, sandbox.max_processes)  # of the instructor's processes, machine-wide
    cap(resource.RLIMIT_FSIZE, sandbox.max_file_mb << 20)
    cap(resource.RLIMIT_NOFILE, 1024)
    cap(resource.RLIMIT_CORE, 0)


def launch(sandbox: Sandbox, argv: list[str]) -> None:
    args = bwrap_arguments(sandbox, argv)
    if sandbox.cgroup:
        from autograder.sandbox import cgroups

        cgroups.join(sandbox.cgroup)  # before bwrap: every process of the sandbox starts inside the cap
    if sandbox.status:
        # bwrap writes its child's pid and namespaces here: the grader finds the sandbox by them afterwards
        fd = os.open(sandbox.status, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        os.set_inheritable(fd, True)
        args[1:1] = ["--json-status-fd", str(fd)]
    _set_limits(sandbox)  # inherited by everything in the sandbox, and past setpriv: the student's uid cannot raise them
    os.execv(shutil.which("bwrap"), args)


class SandboxedKernelManager(AsyncKernelManager):
    """jupyter_client's kernel manager, with the kernel started inside ``SANDBOX`` and reached over Unix sockets."""

    sandbox: Sandbox | None = None  # set by the worker before nbgrader starts the kernel

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        box = type(self).sandbox
        self.transport = "ipc"
        self.ip = os.path.join(box.runtime, "kernel")
        self.connection_file = os.path.join(box.runtime, "kernel.json")

    @property
    def kernel_spec(self):
        spec = super().kernel_spec
        if spec is not None:
            # A signal would reach bwrap, not the kernel; ipykernel interrupts itself on this message instead.
            spec.interrupt_mode = "message"
        return spec

    def format_kernel_cmd(self, extra_arguments=None):
        return type(self).sandbox.wrap(super().format_kernel_cmd(extra_arguments))

    async def _async_pre_start_kernel(self, **kw):
        cmd, kw = await super()._async_pre_start_kernel(**kw)
        box = type(self).sandbox
        if box.uid is not None and os.geteuid() == 0 and os.path.exists(self.connection_file):
            os.chown(self.connection_file, box.uid, box.uid)  # written 0600 by root: the kernel must read it
        kw["cwd"] = box.runtime  # the launcher's own folder; bwrap then enters the work folder
        return cmd, kw


def die_with(parent: int) -> None:
    """Be killed when ``parent`` (the worker that started this launcher) dies, and go at once if it has already.

    bwrap's own --die-with-parent takes hold only once bwrap runs; a worker killed while this launcher was still
    starting left an orphaned sandbox whose kernel held the worker's pipes, and grading waited on them for ever
    (tests/autograder/test_cli.py kills a worker in that window). The setting outlives the exec into bwrap."""
    import ctypes
    import signal

    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # 1: PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(1)


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 4 or argv[2] != "--" or not argv[1].isdigit():
        sys.exit("usage: python -m autograder.sandbox.bubblewrap SANDBOX_JSON PARENT_PID -- COMMAND...")
    die_with(int(argv[1]))
    launch(Sandbox(**json.loads(argv[0])), argv[3:])


if __name__ == "__main__":
    main()

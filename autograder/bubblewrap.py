"""The sandbox a student's kernel runs in while it is graded, built with bubblewrap (bwrap).

A submission is hostile code, and the kernel is the only process that runs it.  The
grading worker (nbgrader, the comparison with hidden golden outputs, the grades) stays
outside; it starts the kernel through ``python -m autograder.bubblewrap``, which:
  1. sets resource limits that the sandbox cannot raise: address space, CPU seconds,
     processes (per uid, so each student gets a uid of their own), file size, open files,
     and no core dumps;
  2. opens every folder the sandbox may see while it is still root (the interpreter lives
     under /root here, which an unprivileged uid cannot even traverse);
  3. drops to the student's unprivileged uid, and
  4. executes ``bwrap`` with its own user, PID, network (loopback only), IPC, UTS and cgroup
     namespaces; a read-only view of /usr, /etc, the interpreter, the venv, the engine and
     the visible data; a tmpfs for /tmp and HOME; and write access to one private folder.
     labs/, course/, autograder/hidden/ and design/, other submissions and the gradebook are not there.

The kernel talks to the worker over Unix sockets in a folder both can see (ZeroMQ's
``ipc`` transport), since the sandbox has no network.  Everything the sandbox started is
in its PID namespace, so it all dies with the kernel; the worker cannot be signalled
from inside, because no process outside the namespace is visible.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import resource
import shutil
import sys
from pathlib import Path

from jupyter_client.manager import AsyncKernelManager

REPO = Path(__file__).resolve().parents[1]
HOME = "/home/student"
UID_BASE, UID_COUNT = 61000, 4000  # one uid per kernel at a time, machine-wide: RLIMIT_NPROC counts per uid
ENGINE_PARTS = ("miniengine", "autograder", "data")  # what the kernel may import or read from the repository


@dataclasses.dataclass
class Sandbox:
    work: str      # the kernel's current folder, the only place it may write (besides its tmpfs)
    runtime: str   # connection file and kernel sockets, shared with the worker
    cases: str     # where the hidden files' inputs appear while a hidden test cell runs (read-only inside)
    uid: int
    inputs: str = ""  # the grader's copy of those inputs (autograder.hidden_spec.public_view), never mounted
    hidden_cells: list = dataclasses.field(default_factory=list)  # grade ids of the lab's hidden test cells
    memory_gb: float = 6.0
    cpu_seconds: int = 600
    max_processes: int = 256  # threads count too: torch, ZeroMQ and IPython start a few dozen
    max_file_mb: int = 256
    tmp_mb: int = 512

    def prepare(self) -> None:
        """Make the private folders, owned by the student's uid (the worker runs as root)."""
        os.makedirs(self.cases, exist_ok=True)
        self.show_hidden_inputs(False)
        for folder in (self.work, self.runtime):
            os.makedirs(folder, exist_ok=True)
            if os.geteuid() == 0:
                os.chown(folder, self.uid, self.uid)
            os.chmod(folder, 0o700)

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
        return [sys.executable, "-m", "autograder.bubblewrap", json.dumps(dataclasses.asdict(self)), "--", *argv]


@contextlib.contextmanager
def claimed_uid():
    """A sandbox uid that no other kernel on this machine has now, held until the block ends.

    Two grading runs at once (two instructors, or two test workers) must not share a uid: a uid's processes
    share one RLIMIT_NPROC, and after a student's grading the worker kills whatever still runs as that uid.
    A lock file per uid decides; the lock goes away with the process that holds it, even a killed one.
    """
    import fcntl
    import tempfile

    folder = Path(tempfile.gettempdir()) / "autograder-uids"
    folder.mkdir(mode=0o700, exist_ok=True)
    for uid in range(UID_BASE, UID_BASE + UID_COUNT):
        fd = os.open(folder / f"{uid}.lock", os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        try:
            yield uid
        finally:
            os.close(fd)  # releases the lock
        return
    raise RuntimeError(f"all {UID_COUNT} sandbox uids from {UID_BASE} are in use")


def unavailable() -> str | None:
    """Why no sandbox can be made on this machine, or None when it can."""
    if not sys.platform.startswith("linux"):
        return "bubblewrap needs Linux"
    if not shutil.which("bwrap"):
        return "bwrap is not installed (Debian/Ubuntu: apt-get install bubblewrap; `make setup` does it as root)"
    if os.geteuid() != 0:
        return "grading must run as root, to give each student's kernel an unprivileged uid of its own"
    import subprocess

    try:
        with claimed_uid() as uid:
            probe = Sandbox(work="/", runtime="/", cases="/", uid=uid)
            done = subprocess.run(probe.wrap(["/bin/true"]), capture_output=True, text=True, timeout=30)
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as e:
        return f"bwrap could not start ({e})"
    if done.returncode != 0:
        return f"bwrap could not make a sandbox here: {done.stderr.strip()[-300:] or done.returncode}"
    return None


# ------------------------------------------------------------------ inside the launcher (runs as root, then drops)

def _read_only_sources(sandbox: Sandbox) -> list[str]:
    """Folders the kernel reads: the system, the interpreter, the venv, the engine, the visible data, the inputs."""
    prefixes = {os.path.realpath(p) for p in (sys.base_prefix, sys.prefix)}
    folders = ["/usr", "/etc", *sorted(p for p in prefixes if not p.startswith("/usr/"))]
    folders += [str(REPO / part) for part in ENGINE_PARTS]
    if sandbox.cases != "/":
        folders.append(sandbox.cases)
    return [f for f in folders if os.path.isdir(f)]


def bwrap_arguments(sandbox: Sandbox, argv: list[str]) -> list[str]:
    read_only = _read_only_sources(sandbox)
    writable = [] if sandbox.work == "/" else [sandbox.work, sandbox.runtime]
    home = HOME
    # bwrap runs as root so that it can mount what the student's uid cannot reach, without a user namespace, so
    # that the uid the kernel gets is a real one: RLIMIT_NPROC does not apply to root, nor to a uid mapped to it.
    args = ["bwrap", "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-net", "--unshare-ipc",
            "--unshare-uts", "--unshare-cgroup-try", "--hostname", "grading-sandbox",
            "--proc", "/proc", "--dev", "/dev",
            "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib", "--symlink", "usr/sbin", "/sbin"]
    if os.path.isdir("/usr/lib64"):
        args += ["--symlink", "usr/lib64", "/lib64"]
    for folder in ("/tmp", home):
        args += ["--size", str(sandbox.tmp_mb << 20), "--perms", "1777", "--tmpfs", folder]
    # A private /dev/shm: multiprocessing's locks and queues are POSIX semaphores there (lab 09 starts its
    # tensor-parallel ranks with torch.multiprocessing).  bwrap's --dev leaves it unwritable.
    args += ["--size", str(64 << 20), "--perms", "1777", "--tmpfs", "/dev/shm"]
    # bwrap would make the folders above each mount point 0700 root; the student's uid must traverse them.
    parents = sorted({str(p) for path in read_only + writable for p in Path(path).parents
                      if str(p) not in ("/", "/tmp", home)}, key=lambda p: p.count("/"))
    for parent in parents:
        args += ["--perms", "0755", "--dir", parent]
    for path in read_only:
        args += ["--ro-bind", path, path]
    # Inside the engine's folder: no hidden data, no design part's reference (autograder/design/, an answer key
    # for the labs' design tasks), and no other kernel's state from the venv's home.
    for mask in (REPO / "autograder" / "hidden", REPO / "autograder" / "design", Path(sys.prefix) / "home"):
        if mask.is_dir():
            args += ["--tmpfs", str(mask), "--remount-ro", str(mask)]
    for path in writable:
        args += ["--bind", path, path]
    if writable:
        args += ["--chdir", sandbox.work]
    env = {
        "HOME": home, "PATH": f"{os.path.dirname(sys.executable)}:/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
        "TMPDIR": "/tmp", "IPYTHONDIR": f"{home}/.ipython", "MPLCONFIGDIR": f"{home}/.matplotlib",
        "JUPYTER_CONFIG_DIR": f"{home}/.jupyter", "JUPYTER_DATA_DIR": f"{home}/.jupyter-data",
        "JUPYTER_RUNTIME_DIR": f"{home}/.jupyter-runtime", "JUPYTER_PLATFORM_DIRS": "1",
        "PYDEVD_DISABLE_FILE_VALIDATION": "1", "PYTHONDONTWRITEBYTECODE": "1",
        "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
        "AUTOGRADER_KERNEL_MEMORY_GB": str(sandbox.memory_gb), "AUTOGRADER_HIDDEN_CASES": sandbox.cases,
    }
    # OPENBLAS_*: this machine's OpenBLAS needs them.  NBGRADER_EXECUTION: nbgrader's autograde sets it, and the
    # labs' measurement cells run short under it, as grading promises.
    for name in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "NBGRADER_EXECUTION"):
        if name in os.environ:
            env[name] = os.environ[name]
    args.append("--clearenv")
    for name, value in env.items():
        args += ["--setenv", name, value]
    drop = ["setpriv", f"--reuid={sandbox.uid}", f"--regid={sandbox.uid}", "--clear-groups", "--inh-caps=-all",
            "--bounding-set=-all", "--no-new-privs", "--"]
    return args + ["--", *(drop if os.geteuid() == 0 else []), *argv]


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
    cap(resource.RLIMIT_NPROC, sandbox.max_processes)
    cap(resource.RLIMIT_FSIZE, sandbox.max_file_mb << 20)
    cap(resource.RLIMIT_NOFILE, 1024)
    cap(resource.RLIMIT_CORE, 0)


def launch(sandbox: Sandbox, argv: list[str]) -> None:
    args = bwrap_arguments(sandbox, argv)
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
        if os.geteuid() == 0 and os.path.exists(self.connection_file):
            os.chown(self.connection_file, box.uid, box.uid)  # written 0600 by root: the kernel must read it
        kw["cwd"] = box.runtime  # the launcher's own folder; bwrap then enters the work folder
        return cmd, kw


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 3 or argv[1] != "--":
        sys.exit("usage: python -m autograder.bubblewrap SANDBOX_JSON -- COMMAND...")
    launch(Sandbox(**json.loads(argv[0])), argv[2:])


if __name__ == "__main__":
    main()

"""A user's terminal, for the tests that run documentation as written (the README's quick starts,
docs/embeddings.md's): the fenced blocks of a Markdown section, one bash typed into line by line in a
network namespace of its own, a fresh clone and a new user's environment."""
from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]
# the stack's default ports (`serving up`), needed free when no network namespace can be had
DEFAULT_PORTS = (8000, 8001, 8002, 8003, 8004, 8080, 9090, 9091, 9999)


# --- a document's blocks ----------------------------------------------------------------------

def section_blocks(text: str, heading: str, lang: str) -> list[str]:
    """The fenced ``lang`` blocks under ``## heading``, up to the next ``## `` heading."""
    start = text.index(f"## {heading}\n")
    end = text.find("\n## ", start + 1)
    section = text[start:end if end >= 0 else len(text)]
    return re.findall(rf"^```{lang}\n(.*?)^```$", section, flags=re.MULTILINE | re.DOTALL)


def command_lines(block: str) -> list[str]:
    """The block's commands as typed: comment-only and blank lines dropped, continuations joined."""
    lines, pending = [], ""
    for raw in block.splitlines():
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1]
            continue
        line, pending = (pending + raw).strip(), ""
        if line and not line.startswith("#"):
            lines.append(line)
    return lines


# --- a user's terminal ------------------------------------------------------------------------

class Shell:
    """One bash reading the commands from a pipe, one at a time, its output in a log file."""

    def __init__(self, cwd: Path, env: dict[str, str], log: Path, netns: bool) -> None:
        bash = ["bash", "--noprofile", "--norc"]
        argv = ["unshare", "--net", "--", "sh", "-c", "ip link set lo up && exec " + shlex.join(bash)] if netns else bash
        self.log = log
        self._out = open(log, "wb")
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=self._out, stderr=subprocess.STDOUT,
                                     cwd=cwd, env=env, start_new_session=True)
        self.netns = netns
        self.count = 0
        self.home = f"SERVING_HOME={env['SERVING_HOME']}".encode() if env.get("SERVING_HOME") else None

    def type(self, line: str, timeout: float) -> tuple[int, str]:
        """Run one line as typed; its exit status and what the terminal showed meanwhile."""
        self.count += 1
        marker = f"__readme_step_{self.count}__"
        start = self.log.stat().st_size
        # on a line of its own even after an answer with no newline at its end (curl's)
        self.proc.stdin.write(f"{line}\nprintf '\\n{marker}=%s\\n' \"$?\"\n".encode())
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout
        while True:
            text = self.log.read_bytes()[start:].decode(errors="replace")
            found = re.search(rf"\n{marker}=(\d+)\n", text)
            if found:
                return int(found.group(1)), text[:found.start()]
            if self.proc.poll() is not None:
                raise AssertionError(f"the shell exited ({self.proc.returncode}) running: {line}\n{self.tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no end after {timeout}s: {line}\n{self.tail()}")
            time.sleep(0.2)

    def tail(self, chars: int = 6000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def prefix(self) -> list[str]:
        """What runs a command in this shell's network (namespace)."""
        return ["nsenter", f"--target={self.proc.pid}", "--net", "--"] if self.netns else []

    def close(self) -> None:
        """`serving up` is stopped as Ctrl-C/SIGTERM stops it, then the shell; nothing is left running."""
        try:
            family = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            family = []
        for proc in family:
            try:
                if proc.ppid() == self.proc.pid:  # the shell's own jobs: `serving up &`
                    proc.send_signal(signal.SIGTERM)
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs([p for p in family if _is_child(p, self.proc.pid)], timeout=60)
        self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for proc in family:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(family, timeout=10)
        self._kill_the_rest()
        self._out.close()

    def _kill_the_rest(self) -> None:
        """What was started after ``family`` was listed (a process started while the stack stopped,
        multiprocessing's resource tracker) still carries this shell's SERVING_HOME."""
        if self.home is None:
            return
        for proc in psutil.process_iter():
            try:
                if self.home in Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0"):
                    proc.kill()
            except (OSError, psutil.Error):
                pass


def _is_child(proc: psutil.Process, parent: int) -> bool:
    try:
        return proc.ppid() == parent
    except psutil.NoSuchProcess:
        return False


def netns_works() -> bool:
    if not (shutil.which("unshare") and shutil.which("nsenter") and shutil.which("ip")):
        return False
    return subprocess.run(["unshare", "--net", "--", "ip", "link", "set", "lo", "up"],
                          capture_output=True).returncode == 0


def taken_ports() -> list[int]:
    import socket

    taken = []
    for port in DEFAULT_PORTS:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                taken.append(port)
    return taken


def fresh_clone(dest: Path) -> Path:
    """The repository's files as a clone has them (the working tree's versions), and its venvs: `make setup`
    in the copy finds both installed (the vLLM one too, or it would download it inside the namespace)."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    (dest / ".venv").symlink_to(REPO / ".venv")
    if (REPO / ".venv-vllm").exists():
        (dest / ".venv-vllm").symlink_to(REPO / ".venv-vllm")
    return dest


def user_env(tmp: Path) -> dict[str, str]:
    """A new user's shell: no venv active, no SERVING_* settings (the test session's marker kept,
    so a leak is still found), a SERVING_HOME and credentials file of its own."""
    venv_bin = str(REPO / ".venv" / "bin")
    env = {k: v for k, v in os.environ.items()
           if (not k.startswith("SERVING_") or k.startswith("SERVING_TEST_"))
           and k not in ("VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "/usr/bin:/bin").split(os.pathsep) if p != venv_bin)
    env["SERVING_HOME"] = str(tmp / "serving-home")
    env["SERVING_CREDENTIALS"] = str(tmp / "serving-home" / "credentials")
    return env


def step(shell: Shell, line: str, timeout: float = 600) -> str:
    rc, out = shell.type(line, timeout)
    assert rc == 0, f"`{line}` exited {rc}:\n{out[-4000:]}"
    return out


def json_answer(output: str) -> dict:
    lines = [line for line in output.splitlines() if line.startswith("{")]
    assert lines, f"no JSON answer in: {output!r}"
    return json.loads(lines[-1])


def venv_is_current() -> bool:
    """`make setup` in the copy must find the venv installed for these pyproject.toml and setup.sh:
    otherwise it would reinstall the project from the temporary copy into the shared venv."""
    stamp = hashlib.sha256((REPO / "pyproject.toml").read_bytes() + (REPO / "scripts" / "setup.sh").read_bytes())
    return (REPO / ".venv" / f".installed-{stamp.hexdigest()[:12]}").exists()



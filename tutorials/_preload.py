"""A kernel launcher that imports the heavy third-party modules once and forks each kernel.

``tutorials/build.py``'s ``run_tutorial(..., preload=True)`` uses it: a *server* process
(``python _preload.py serve SOCKET MODULES``) imports ``MODULES`` (numpy, torch, IPython,
ipykernel: seconds of CPU per kernel otherwise) and then forks one child per kernel
request. Each child is a new process that has executed no notebook code: it takes the
environment and working directory of the request, then starts ipykernel exactly as
``python -m ipykernel_launcher -f CONNECTION_FILE`` does. Nothing of ctxkit and nothing that
reads a per-run setting (``TMPDIR``, ``CTXKIT_DATA``, the smoke switch, ``MPLBACKEND``: so not
matplotlib) is preloaded, and a server only serves runs whose other environment variables
(thread counts included) equal its own.

The kernel spec's ``argv`` runs the *client* (``python -S _preload.py SOCKET CONNECTION_FILE``,
stdlib only, milliseconds): it asks the server for a kernel, forwards the signals Jupyter
sends it (interrupt, terminate) to that kernel and exits with the kernel's exit status, so
Jupyter manages it like the kernel itself. When the client dies (Jupyter kills it), the
kernel sees its socket close and exits too.
"""

import json
import os
import signal
import socket
import sys


def _client(socket_path: str, connection_file: str) -> None:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(socket_path)
    request = {"connection_file": os.path.abspath(connection_file), "cwd": os.getcwd(), "env": dict(os.environ)}
    conn.sendall((json.dumps(request) + "\n").encode())
    replies = conn.makefile("rb")
    pid = json.loads(replies.readline())["pid"]

    def forward(signum, _frame):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, forward)
    line = replies.readline()  # the kernel's exit status, once it has exited
    code = json.loads(line)["exit"] if line else 1
    if code < 0:  # killed by a signal: end the same way
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


def _kernel(conn: socket.socket, request: dict) -> None:
    """In the forked child: become the kernel of ``request``; never returns."""
    import atexit
    import tempfile
    import threading

    code = 1
    try:
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        tempfile.tempdir = None  # TMPDIR is read again

        def watch():
            conn.recv(1)  # returns when the client's end closes: Jupyter killed it
            os._exit(1)

        threading.Thread(target=watch, daemon=True, name="preload-client-watch").start()
        from ipykernel import kernelapp

        sys.argv = [os.path.join(os.path.dirname(os.path.dirname(kernelapp.__file__)), "ipykernel_launcher.py"),
                    "-f", request["connection_file"]]

        kernelapp.launch_new_instance(argv=["-f", request["connection_file"]])
        code = 0
    except SystemExit as err:
        code = err.code if isinstance(err.code, int) else (0 if err.code is None else 1)
    except BaseException:  # noqa: BLE001 - reported, then the kernel process ends
        import traceback

        traceback.print_exc()
    finally:
        try:
            atexit._run_exitfuncs()
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:  # noqa: BLE001
                    pass
            os._exit(code)


def _serve(socket_path: str, modules: str) -> None:
    import importlib
    import select

    for name in filter(None, modules.split(",")):
        importlib.import_module(name)
    for name in ("matplotlib", "ipykernel.kernelapp", "ctxkit"):
        # matplotlib reads MPLBACKEND, kernelapp JPY_PARENT_PID when imported; ctxkit is the subject
        if name in sys.modules:
            sys.exit(f"preload: {name} got imported; it must be the kernel's own import")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(socket_path + ".tmp")
    server.listen(16)
    os.rename(socket_path + ".tmp", socket_path)  # appears only once it accepts connections
    clients = {}  # kernel pid -> the client's connection
    try:
        while True:
            ready, _, _ = select.select([server, sys.stdin], [], [], 0.05)
            if sys.stdin in ready and not os.read(sys.stdin.fileno(), 1024):
                break  # the parent closed our stdin (or died): stop
            if server in ready:
                conn, _ = server.accept()
                request = json.loads(conn.makefile("rb").readline())
                pid = os.fork()
                if pid == 0:
                    server.close()
                    for other in clients.values():  # other kernels' connections are not this one's
                        other.close()
                    devnull = os.open(os.devnull, os.O_RDONLY)  # the kernel must not hold our stdin pipe
                    os.dup2(devnull, sys.stdin.fileno())
                    os.close(devnull)
                    _kernel(conn, request)
                clients[pid] = conn
                conn.sendall((json.dumps({"pid": pid}) + "\n").encode())
            while clients:
                pid, status = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    break
                conn = clients.pop(pid, None)
                if conn is not None:
                    try:
                        conn.sendall((json.dumps({"exit": os.waitstatus_to_exitcode(status)}) + "\n").encode())
                    except OSError:
                        pass
                    conn.close()
    finally:
        for pid in clients:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.unlink(socket_path)
        except OSError:
            pass
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # nothing to tear down: skip the seconds of unloading torch


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        if sys.path and sys.path[0] in ("", os.path.dirname(os.path.abspath(__file__))):
            del sys.path[0]  # as ipykernel_launcher does: the kernel adds its cwd back itself
        _serve(sys.argv[2], sys.argv[3])
    else:
        _client(sys.argv[1], sys.argv[2])

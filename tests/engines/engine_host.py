"""One process that imports an engine's modules once and runs this folder's check scripts in
processes forked from it: an engine's import is the slow part of a check (20-30 CPU-seconds for
vLLM), paid once per pytest worker instead of once per script run (engine_env.run_engine).

Usage: python engine_host.py MODULE [MODULE ...]

Runs with the unpacked engine wheel and its dependencies first on sys.path, as the scripts did
on their own. Imports the MODULEs (one that fails to import is left for the script to import and
fail on), then reads jobs on stdin, one JSON line each: {"script": path, "argv": [...], "log":
path, "env": {...}}. Each job runs in a child forked from this process as `python SCRIPT ARGV...`
would run it (run as __main__, sys.argv, the job's environment), its stdout and stderr into the
log file; the answer is one JSON line
on stdout, {"code": its exit status}. Children share nothing with each other: each starts from
the state after the imports; this process itself runs no check.
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import sys
import traceback


def run(job: dict) -> int:
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            log = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(log, 1)  # this process's stdout carries the answers: the script's goes to the log
            os.dup2(log, 2)
            os.close(log)
            os.environ.clear()
            os.environ.update(job["env"])
            sys.argv = [job["script"], *job["argv"]]
            sys.path.insert(0, os.path.dirname(os.path.abspath(job["script"])))
            runpy.run_path(job["script"], run_name="__main__")
            code = 0
        except SystemExit as exc:  # as the interpreter exits: None -> 0, an int as is, anything else printed -> 1
            if exc.code is None or isinstance(exc.code, int):
                code = exc.code or 0
            else:
                print(exc.code, file=sys.stderr)
        except BaseException:  # noqa: BLE001 - printed as the script's own process would die of it
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def main() -> int:
    for module in sys.argv[1:]:
        try:
            importlib.import_module(module)
        except Exception:  # noqa: BLE001 - the script that needs it imports it again and fails there, in its log
            pass
    for line in sys.stdin:
        print(json.dumps({"code": run(json.loads(line))}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

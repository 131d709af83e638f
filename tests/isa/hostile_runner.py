"""Run hostile ``npuemu`` command lines in this process, under a memory cap and a time limit
per case, and print one JSON result per case (used by test_hostile_inputs.py).

    python hostile_runner.py CASES.json MEMORY_BYTES SECONDS_PER_CASE

A case passes when ``npuemu`` returns normally (0, or 2 with an ``npuemu ...: error:`` line on
stderr) - no exception escapes ``main`` (no traceback), no MemoryError, no hang.
"""

from __future__ import annotations

import contextlib
import io
import json
import resource
import signal
import sys
import traceback


class Hang(Exception):
    """The case ran past its time limit."""


def _alarm(signum, frame):
    raise Hang()


def run_case(argv: list[str], seconds: int) -> dict:
    from npuemu.tools.cli import main

    out, err = io.StringIO(), io.StringIO()
    signal.alarm(seconds)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as exit_:  # argparse's usage errors
                code = exit_.code if isinstance(exit_.code, int) else 2
        failure = None
    except Hang:
        code, failure = None, f"no result within {seconds} s"
    except BaseException as error:  # noqa: BLE001 - exactly what the test looks for
        code, failure = None, "".join(traceback.format_exception_only(type(error), error)).strip()[-400:]
        failure += "\n" + "".join(traceback.format_tb(error.__traceback__)[-3:])[-1200:]
    finally:
        signal.alarm(0)
    errors = [line for line in err.getvalue().splitlines() if line.strip()]
    if failure is None and code not in (0, 2):
        failure = f"exit code {code}"
    if failure is None and code == 2 and not (errors and errors[0].startswith("npuemu") or "usage:" in err.getvalue()):
        failure = f"exit 2 without an error line: {err.getvalue()[:300]!r}"
    if failure is None and "Traceback" in err.getvalue():
        failure = "a traceback on stderr"
    return {"code": code, "error": errors[0][:300] if errors else "", "failure": failure}


def main() -> None:
    cases_path, memory, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    signal.signal(signal.SIGALRM, _alarm)
    import npuemu.emulator.runtime  # noqa: F401 - import (and JIT set-up) outside the per-case limit
    import npuemu.tools.cli  # noqa: F401

    with open(cases_path, encoding="utf-8") as handle:
        cases = json.load(handle)
    results = []
    for label, argv in cases:
        results.append({"label": label, "argv": argv, **run_case(argv, seconds)})
    sys.stdout.write(json.dumps(results) + "\n")


if __name__ == "__main__":
    main()

"""The sandboxed program's end of its result channel (the parent's end is in env_pool/isolation/sandbox.py).

This runs inside the sandbox, in the same process as the candidate's code once that is
loaded, so it holds nothing the parent trusts: ``run_sandboxed`` passes an inherited pipe whose
fd number is in ``RESULT_FD_ENV``, and reads whatever arrives there as untrusted bytes. The
program must open the channel before it runs untrusted code, so that programs the candidate
execs never inherit it.
"""
from __future__ import annotations

import os
import sys

RESULT_FD_ENV = "CUDA_AGENT_RESULT_FD"


def child_result_channel():
    """The result channel as a writable binary file (close it to flush).

    Call it once, first thing, before running any untrusted code. The fd is made
    non-inheritable and the variable removed, so programs the child execs do not get it.
    """
    fd = int(os.environ.pop(RESULT_FD_ENV))
    os.set_inheritable(fd, False)
    return os.fdopen(fd, "wb")


def child_exit(channel, result: bytes) -> None:
    """Write the result, flush everything, and exit at once (status 0).

    os._exit skips atexit handlers and finalizers: nothing untrusted code registered runs
    after the result is written.
    """
    channel.write(result)
    channel.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

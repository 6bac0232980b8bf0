"""A Ray job's entrypoint for a remote step: runs ``isolated_child`` on the call in
``$MARIN_CALL`` and prints its outcome between markers (see ``ray.py``)."""

from __future__ import annotations

import base64
import os
import sys
import tempfile

from marin.execution.pipeline import isolated_child
from marin.execution.pipeline.remote.ray import BEGIN, END


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="marin-ray-job-") as tmp:
        call, result = os.path.join(tmp, "call.pkl"), os.path.join(tmp, "result.pkl")
        with open(call, "wb") as f:
            f.write(base64.b64decode(os.environ["MARIN_CALL"]))
        isolated_child.main([call, result])
        with open(result, "rb") as f:
            data = f.read()
    sys.stdout.write(f"\n{BEGIN}{base64.b64encode(data).decode()}{END}\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())

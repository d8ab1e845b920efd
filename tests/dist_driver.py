"""Runs several distributed training cases inside ONE torchrun launch (tests/test_dist_*.py).

Each case is one `shoestring.dist.launch.run` call (its own process group, created and
destroyed); batching cases per launch saves the ~10 s interpreter and torch start-up per
process on the 2-core CI machine. argv[1]: a JSON list of {"output", "parallel", ...} dicts
(keys as `run`'s keyword arguments); common keys in argv[2] (JSON). A `ShoestringError`
exits 2 with the message, like the CLI.
"""

from __future__ import annotations

import json
import sys

from shoestring.dist.launch import run
from shoestring.errors import ShoestringError


def main() -> None:
    cases = json.loads(sys.argv[1])
    common = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    for case in cases:
        kw = {**common, **case}
        try:
            run(kw.pop("data"), kw.pop("output"), kw.pop("parallel"), **kw)
        except ShoestringError as e:
            print(f"error: {e.message}", file=sys.stderr, flush=True)
            sys.exit(2)


if __name__ == "__main__":
    main()

"""The step runner, started without ``site``::

    python -S .../waypost/runner/launch.py OPTIONS -- COMMAND ...
    python -S .../waypost/runner/launch.py --bundle LIST     (waypost.runner.bundle)
    python -S .../waypost/runner/launch.py --serve FD DIR    (waypost.runner.server)

is ``python -m waypost.runner OPTIONS -- COMMAND ...`` less the ~3 ms that
``site`` (reading every installed package's ``.pth`` files) costs each step.
The runner needs only the standard library and waypost, which is found in
the directory above this file: put after the standard library, so nothing
installed beside waypost can shadow a standard module.
"""

import os
import sys

del sys.path[0]   # this file's own directory: waypost's modules are imported as waypost.*
sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

if sys.argv[1:2] == ["--bundle"]:   # a bundle's Slurm job: waypost.runner.bundle
    from waypost.runner.bundle import run_bundle
    sys.stdout.flush()
    sys.exit(run_bundle(sys.argv[2]))

if sys.argv[1:2] == ["--serve"]:    # the local step server of a run's main process
    from waypost.runner.server import serve
    sys.exit(serve(int(sys.argv[2]), sys.argv[3]))

from waypost.runner.main import run_and_exit  # noqa: E402

run_and_exit()

#!/usr/bin/env bash
# `make test`'s pytest: the suite as two pytest processes at once, each in a
# temp dir of its own: the tests on the local Slurm cluster (marker `slurm`:
# they mostly wait on Slurm's scheduling and polling), on a bucket mount
# (`mount`) and the soaks (`soak`), beside all the others. On 2 cores that
# took the tests from 47 minutes to 27. The first half's output follows the
# other's (and stays in test-artifacts/slurm-tests.log). With arguments, one
# plain pytest run of them.
#
#   tests/run.sh PYTHON [PYTEST_ARGS...]
set -uo pipefail
PY=${1:?usage: tests/run.sh PYTHON [PYTEST_ARGS...]}
shift
if (($#)); then
    exec "$PY" -m pytest -q "$@"
fi
mkdir -p test-artifacts
log=test-artifacts/slurm-tests.log
"$PY" -m pytest -q -m "slurm or mount or soak" -p no:cacheprovider --durations=10 --basetemp=/tmp/waypost-tests-slurm >"$log" 2>&1 &
slurm=$!
trap 'kill $slurm 2>/dev/null' EXIT
"$PY" -m pytest -q -m "not slurm and not mount and not soak" --durations=15 --basetemp=/tmp/waypost-tests-rest
rest=$?
wait "$slurm"
slurm_rc=$?
trap - EXIT
echo
echo "----- the tests on the Slurm cluster, on bucket mounts and the soaks (run beside the ones above; $log) -----"
cat "$log"
# 5: no test selected (a checkout without Slurm tests) is not a failure.
((slurm_rc == 5)) && slurm_rc=0
((rest == 5)) && rest=0
if ((rest != 0 || slurm_rc != 0)); then
    echo "FAILED: the tests on Slurm, on mounts and the soaks exit $slurm_rc, the others $rest"
    exit 1
fi

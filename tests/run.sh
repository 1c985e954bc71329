#!/usr/bin/env bash
# `make test`'s pytest: the suite as three pytest processes at once, each in
# a temp dir of its own: the tests on the local Slurm cluster (marker
# `slurm`: they mostly wait on Slurm's scheduling and polling), on a bucket
# mount (`mount`) and the soaks (`soak`); Snakemake's own test workflows
# (`conformance`: one Snakemake process forking each run) with the tests of
# plain Snakemake's floor beside it (`floor`); and all the others. On 2
# cores the first two took the tests from 47 minutes to 27. Some modules run
# in the first two processes only for balance (`with_slurm`,
# `with_conformance`: tests/conftest.py says which).
# Their output follows the others' (and stays in test-artifacts/). With
# arguments, one plain pytest run of them.
#
#   tests/run.sh PYTHON [PYTEST_ARGS...]
set -uo pipefail
PY=${1:?usage: tests/run.sh PYTHON [PYTEST_ARGS...]}
shift
if (($#)); then
    exec "$PY" -m pytest -q "$@"
fi
mkdir -p test-artifacts
# A fresh folder for this run's temp dirs: pytest's --basetemp removes an old
# one quietly and fails when it cannot (a mount or a process left there by an
# interrupted run), so a fixed name is one killed run away from 74 errors.
tmp=$(mktemp -d "${TMPDIR:-/tmp}/waypost-tests.XXXXXX")
log=test-artifacts/slurm-tests.log
conformance_log=test-artifacts/conformance-tests.log
"$PY" -m pytest -q -m "(slurm or mount or soak or with_slurm) and not conformance" -p no:cacheprovider --durations=10 \
    --basetemp="$tmp/slurm" >"$log" 2>&1 &
slurm=$!
"$PY" -m pytest -q -m "conformance or ((floor or with_conformance) and not slurm and not mount and not soak and not with_slurm)" -p no:cacheprovider \
    --durations=5 -rxXs \
    --basetemp="$tmp/conformance" >"$conformance_log" 2>&1 &
conformance=$!
trap 'kill $slurm $conformance 2>/dev/null' EXIT
"$PY" -m pytest -q -m "not slurm and not mount and not soak and not conformance and not floor and not with_slurm and not with_conformance" --durations=15 \
    --basetemp="$tmp/rest"
rest=$?
wait "$slurm"
slurm_rc=$?
wait "$conformance"
conformance_rc=$?
trap - EXIT
echo
echo "(this run's temp dirs: $tmp)"
echo "----- the tests on the Slurm cluster, on bucket mounts and the soaks (run beside the ones above; $log) -----"
cat "$log"
echo
echo "----- Snakemake's own test workflows with waypost's lines, and the floor's tests (run beside them; $conformance_log) -----"
tail -n 60 "$conformance_log"
# 5: no test selected (a checkout without Slurm tests) is not a failure.
((slurm_rc == 5)) && slurm_rc=0
((conformance_rc == 5)) && conformance_rc=0
((rest == 5)) && rest=0
if ((rest != 0 || slurm_rc != 0 || conformance_rc != 0)); then
    echo "FAILED: the tests on Slurm, on mounts and the soaks exit $slurm_rc, Snakemake's workflows" \
        "$conformance_rc, the others $rest"
    exit 1
fi

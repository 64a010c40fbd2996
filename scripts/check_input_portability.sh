#!/usr/bin/env bash
# Proof that input bits depend on nothing installed: every input of every built-in case, generated under each
# combination of numpy 2.4 / 2.5 (latest patch) and ml_dtypes 0.6.0 / 0.7.0, each in a throwaway venv, must
# have the digests of tests/data/input_digests.json (scripts/input_digests.py --check).
#
#   scripts/check_input_portability.sh [DIGESTS]     # default: tests/data/input_digests.json
#
# One line per combination; exit 1 if any differs (or cannot be set up). Each venv gets only what input
# generation needs: numpy, ml_dtypes, and safetensors, xxhash, pydantic, pyyaml, rich, jinja2 (and their
# dependencies) at the versions of configs/lock-cpu.txt, and the harness itself (pip install --no-deps -e: op
# families are found through its entry points). No framework is installed, so none can be imported. numpy 2.5 needs Python >= 3.12: it runs under python3.12 (on PATH, or
# pyenv's); numpy 2.4 runs under both 3.11 and 3.12, so that a difference would show which of the two moved.
# XFALIGN_TREE=DIR checks the harness/ and cases/ of another tree (e.g. an older commit's, to see it differ).
set -uo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
tree=$(cd "${XFALIGN_TREE:-$repo}" && pwd)
digests=$(realpath "${1:-$repo/tests/data/input_digests.json}")
lock=$repo/configs/lock-cpu.txt
pinned=(safetensors xxhash pydantic pydantic-core annotated-types typing-extensions typing-inspection pyyaml
        rich markdown-it-py mdurl pygments jinja2 markupsafe)
combinations=("3.11 2.4" "3.12 2.4" "3.12 2.5")
ml_dtypes_versions=(0.6.0 0.7.0)

[[ -f $lock ]] || { echo "no $lock: the pinned versions come from it" >&2; exit 2; }
pins=()
for name in "${pinned[@]}"; do
    pin=$(grep -i -m1 "^$name==" "$lock") || { echo "$name is not pinned in $lock" >&2; exit 2; }
    pins+=("$pin")
done

find_python() {  # python$1 on PATH, else pyenv's
    local candidate
    for candidate in "python$1" "$(pyenv root 2>/dev/null)"/versions/"$1".*/bin/python"$1"; do
        if "$candidate" -c "" 2>/dev/null; then echo "$candidate"; return 0; fi
    done
    return 1
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=0
for combination in "${combinations[@]}"; do
    read -r python_version numpy_series <<<"$combination"
    for ml in "${ml_dtypes_versions[@]}"; do
        label="python $python_version numpy $numpy_series.x ml_dtypes $ml"
        venv=$work/py$python_version-numpy$numpy_series-ml$ml
        log=$venv.log
        if ! python=$(find_python "$python_version"); then
            echo "$label: no python$python_version here"; failed=1; continue
        fi
        if ! { "$python" -m venv "$venv" && "$venv/bin/python" -m pip install -q --only-binary=:all: \
                "numpy==$numpy_series.*" "ml_dtypes==$ml" "${pins[@]}" \
              && "$venv/bin/python" -m pip install -q --no-deps -e "$tree"; } >"$log" 2>&1; then
            echo "$label: cannot install:"; tail -5 "$log" | sed 's/^/    /'; failed=1; continue
        fi
        versions=$("$venv/bin/python" -c 'import sys, numpy, ml_dtypes
print(f"python {sys.version.split()[0]} numpy {numpy.__version__} ml_dtypes {ml_dtypes.__version__}")')
        if (cd "$tree" && "$venv/bin/python" scripts/input_digests.py --check "$digests") >"$log" 2>&1; then
            echo "$versions: $(tail -1 "$log")"
        else
            echo "$versions: DIFFERENT: $(tail -1 "$log")"
            head -n -1 "$log" | head -20 | sed 's/^/    /'
            failed=1
        fi
        rm -rf "$venv"
    done
done
exit $failed

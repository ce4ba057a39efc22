#!/usr/bin/env bash
# Print the path of a Python >= 3.12 interpreter, or explain what to install.
#
# Looks, in order, at $PYTHON, python3.13/python3.12/python3 on PATH, and the
# interpreters pyenv has installed (a pyenv shim on PATH may exist without
# being runnable, so every candidate is asked for its version).
set -u

is_new_enough() {
    "$1" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' >/dev/null 2>&1
}

candidates=()
[ -n "${PYTHON:-}" ] && candidates+=("$PYTHON")
for name in python3.13 python3.12 python3; do
    path=$(command -v "$name" 2>/dev/null) && candidates+=("$path")
done
pyenv_root=$(pyenv root 2>/dev/null || echo "${PYENV_ROOT:-$HOME/.pyenv}")
for dir in "$pyenv_root"/versions/3.1[2-9]* /usr/local/bin /usr/bin; do
    for path in "$dir"/bin/python3 "$dir"/python3.1[2-9]; do
        [ -x "$path" ] && candidates+=("$path")
    done
done

for candidate in "${candidates[@]}"; do
    if is_new_enough "$candidate"; then
        "$candidate" -c 'import sys; print(sys.executable)'
        exit 0
    fi
done

cat >&2 <<'MSG'
kickmsg needs Python 3.12 or newer, and none was found.
Install one, for example:  pyenv install 3.12   or   apt install python3.12 python3.12-venv
or point PYTHON at it:     make test PYTHON=/path/to/python3.12
MSG
exit 1

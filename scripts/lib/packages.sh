# shellcheck shell=bash
# Sourced by scripts/install and scripts/lock once .venv exists: which pip and uv to run, and where
# packages come from.

# pip for .venv: its own once it has one (the locks bring it), else that of the interpreter .venv was
# made from (pip --python; .venv is made without pip, 4 s sooner), else ensurepip's.
if [ -x .venv/bin/pip ]; then
  PIP=(.venv/bin/python -m pip)
else
  base=$(.venv/bin/python -c 'import sys; print(sys._base_executable)')
  if "$base" -m pip --version >/dev/null 2>&1; then
    PIP=("$base" -m pip --python .venv/bin/python)
  else
    .venv/bin/python -m ensurepip -q
    PIP=(.venv/bin/python -m pip)
  fi
fi

# uv does not read pip's configuration: the places pip is configured to look (find-links such as
# /opt/wheels with the CPU build of PyTorch, extra indexes, its certificate) are handed to uv, so
# that locking and installing look in the same places.
PIP_CONFIG=$("${PIP[@]}" config list 2>/dev/null || true)

# The value pip uses for a setting: its environment variable, else its config files.
pip_setting() {
  local var
  var=PIP_$(tr 'a-z-' 'A-Z_' <<<"$1")
  if [ -n "${!var:-}" ]; then
    printf '%s\n' "${!var}"
  else
    sed -n "s/^\(global\|install\)\.$1='\(.*\)'\$/\2/p" <<<"$PIP_CONFIG" | tail -n 1
  fi
}

UV_SOURCES=()
for link in $(pip_setting find-links); do UV_SOURCES+=(--find-links "$link"); done
for url in $(pip_setting index-url); do UV_SOURCES+=(--index-url "$url"); done
for url in $(pip_setting extra-index-url); do UV_SOURCES+=(--extra-index-url "$url"); done
# Like pip: the best version on any of them (uv's default takes a package from the first index that
# has it, and playwright, for one, is on a local index here but not in the version pinned).
UV_SOURCES+=(--index-strategy unsafe-best-match)
cert=$(pip_setting cert)
if [ -n "$cert" ] && [ -z "${SSL_CERT_FILE:-}" ]; then export SSL_CERT_FILE=$cert; fi
timeout=$(pip_setting default-timeout)
if [ -n "$timeout" ] && [ -z "${UV_HTTP_TIMEOUT:-}" ]; then export UV_HTTP_TIMEOUT=${timeout%.*}; fi

# Sets UV to a uv to run: one on PATH, else the one pinned in requirements/uv.txt, put into .venv.
# Fails (status 1) when neither can be had; the caller then uses pip.
find_uv() {
  if UV=$(command -v uv); then return 0; fi
  UV=.venv/bin/uv
  [ -x "$UV" ] || "${PIP[@]}" install -q --require-hashes -r requirements/uv.txt >/dev/null 2>&1
}

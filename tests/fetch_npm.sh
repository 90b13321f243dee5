#!/bin/sh
# Installs npm packages (exact versions) into DIR from the npm registry, once: a stamp file
# records what is there, so later runs reuse it. Nothing fetched is committed.
#   fetch_npm.sh DIR PACKAGE@VERSION...
set -eu
dir=${1:?usage: fetch_npm.sh DIR PACKAGE@VERSION...}
shift
pkgs="$*"
stamp="$dir/.fetched"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$pkgs" ]; then
    echo "npm packages already in $dir"
    exit 0
fi
command -v npm >/dev/null || { echo "npm is needed to fetch $pkgs" >&2; exit 1; }
mkdir -p "$dir"
# shellcheck disable=SC2086
npm install --prefix "$dir" --no-save --no-package-lock --no-audit --no-fund --loglevel=error $pkgs
for p in "$@"; do
    test -f "$dir/node_modules/${p%@*}/package.json"
done
echo "$pkgs" > "$stamp"
echo "fetched $pkgs into $dir"

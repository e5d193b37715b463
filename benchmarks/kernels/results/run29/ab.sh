#!/bin/bash
# usage: ab.sh LAYOUT(2|3) root:name:cfgjson ...
cd "$(dirname "$0")"
L=$1; shift
for spec in "$@"; do
  root=${spec%%:*}; rest=${spec#*:}; name=${rest%%:*}; cfg=${rest#*:}
  e=(); [ "$L" = 2 ] && e+=(DISABLE_MMA_V3=1)
  env "${e[@]}" ROOT=$root TRITON_CACHE_DIR=/tmp/tc_${L}_$root python3 abl.py "L${L}_${root}_$name" "$cfg" 2>&1 | grep -E "RESULT|Error|error" | head -5
done

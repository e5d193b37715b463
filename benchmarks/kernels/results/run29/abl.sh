#!/bin/bash
# usage: abl.sh LAYOUT(2|3) name:ENV=V,ENV=V ...   (the ablation tree, ablations.diff applied, in _ab/exp)
cd "$(dirname "$0")"
L=$1; shift
for spec in "$@"; do
  name=${spec%%:*}; envs=${spec#*:}
  [ "$envs" = "$spec" ] && envs=""
  e=(); [ "$L" = 2 ] && e+=(DISABLE_MMA_V3=1)
  IFS=, read -ra kv <<< "$envs"; for x in "${kv[@]}"; do [ -n "$x" ] && e+=("$x"); done
  env "${e[@]}" ROOT=exp TRITON_CACHE_DIR=/tmp/tc_${L}_$name python3 abl.py "L${L}_$name" 2>&1 | grep -E "RESULT|Error|error" | head -5
done

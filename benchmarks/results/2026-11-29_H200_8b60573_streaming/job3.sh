#!/bin/bash
# session 12, call 3: row-kernel structure experiment (hand-written variants of logsumexp)
export PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R
timeout 200 python3 .gpu/rowexp/rows.py $PWD/.gpu/rowexp > $R/rows.txt 2>&1; cat $R/rows.txt
cd $OUT && tar czf r.tgz r && rm -rf r

#!/bin/bash
# session 12, call 4: row-kernel load hints; inductor's sum kernel
export PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R
timeout 200 python3 .gpu/rowexp/rows.py $PWD/.gpu/rowexp 2>&1 | grep -v ptxas > $R/rows.txt; cat $R/rows.txt
TORCH_LOGS=output_code timeout 120 python3 -c "
import torch
x = torch.randn(4096, 4096, device='cuda')
f = torch.compile(lambda t: t.sum(1)); f(x)
g = torch.compile(lambda t: torch.logsumexp(t, 1)); g(x)
" > $R/inductor.txt 2>&1
grep -n "triton_meta\|def triton\|XBLOCK\|R0_BLOCK\|RBLOCK\|num_warps\|tl.load\|grid" $R/inductor.txt | head -60
cd $OUT && tar czf r.tgz r && rm -rf r

"""Largest difference between the saved outputs of two trees: cmp.py DIR_A DIR_B"""
import glob, os, sys
import numpy as np
for f in sorted(glob.glob(f"{sys.argv[1]}/*.npy")):
    g = os.path.join(sys.argv[2], os.path.basename(f))
    if os.path.exists(g):
        a, b = np.load(f), np.load(g)
        same = np.array_equal(a, b, equal_nan=True)
        print(f"{os.path.basename(f)}: {'same bits' if same else f'max |diff| {np.nanmax(np.abs(a - b)):.3e}'}")

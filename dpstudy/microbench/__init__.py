"""Microbenchmarks: the extension's kernels against Python loops and PyTorch (kernels.py), and
all_reduce bandwidth per backend (comm.py); figures.py draws both tables."""

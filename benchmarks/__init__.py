"""On-demand speed benchmarks (issue 8): ``python -m benchmarks`` from the repo root.

Not an installed package and not part of CI: the figures are wall-clock times on this machine."""

"""Tuning: the cost model (`cost_model.py`: a plan priced on a machine profile), the machine
probe (`machine_probe.py`: this host's profile, measured once per rank count and cached) and
the autotuner (`autotune.py`: a program's schedules ranked on a profile), which
`compile(..., schedule="auto")`, `coco-run --schedule auto` and `coco-tune` use."""

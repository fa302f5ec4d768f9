"""Side-by-side benchmark of LM-head losses (``bench_lce.py``) and its renderer (``render.py``)."""

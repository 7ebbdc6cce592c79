"""Sweeps: a sweep file's runs (``file``), the sweep folder's bookkeeping (``folder``), the runs in
worker processes (``workers``) or stacked in one process (``stack``), and the controller that
plans, runs and records them (``controller``, what ``fdlit sweep`` calls).
"""
